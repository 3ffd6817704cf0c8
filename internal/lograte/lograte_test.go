package lograte

import (
	"testing"
	"time"
)

// One line per key per interval, and the next line counts those held back.
func TestAllow(t *testing.T) {
	now := time.Unix(1e9, 0)
	l := New(time.Minute, func() time.Time { return now })
	step := func(key string, wantOK bool, wantSuppressed int) {
		t.Helper()
		if ok, n := l.Allow(key); ok != wantOK || n != wantSuppressed {
			t.Errorf("Allow(%q) at %v = %v, %d; want %v, %d", key, now.Format(time.TimeOnly), ok, n, wantOK, wantSuppressed)
		}
	}
	step("a", true, 0)
	step("a", false, 0)
	step("b", true, 0) // keys are apart
	now = now.Add(59 * time.Second)
	step("a", false, 0)
	now = now.Add(time.Second)
	step("a", true, 2)
	step("a", false, 0)
	now = now.Add(time.Hour)
	step("a", true, 1)
	step("b", true, 0)
}
