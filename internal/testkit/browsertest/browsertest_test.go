package browsertest

import "testing"

// What counts as staying on this machine: loopback addresses and localhost, and URLs that
// name no host; anything else is a request to the outside.
func TestLoopback(t *testing.T) {
	for u, want := range map[string]bool{
		"http://127.0.0.1:8080/api/overview": true,
		"http://127.9.9.9/":                  true,
		"http://[::1]:80/":                   true,
		"http://[::ffff:127.0.0.1]/":         true,
		"ws://localhost:9222/devtools":       true,
		"data:,":                             true,
		"about:blank":                        true,
		"https://fonts.googleapis.com/css":   false,
		"http://10.0.0.1/":                   false,
		"http://localhost.example.com/":      false,
		"http://127.0.0.1.nip.io/":           false,
		"//cdn.example.com/x.js":             false,
		"::not a url":                        false,
	} {
		if got := Loopback(u); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", u, got, want)
		}
	}
}
