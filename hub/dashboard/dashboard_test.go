package dashboard

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T, path string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	mux := http.NewServeMux()
	Mount(mux)
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return rec
}

// Every asset is served with its type, the security headers and an ETag that a browser's
// revalidation is answered by (304); other paths are 404.
func TestAssets(t *testing.T) {
	for path, typ := range map[string]string{"/": "text/html", Prefix + "app.js": "text/javascript", Prefix + "app.css": "text/css"} {
		rec := serve(t, path, nil)
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), typ) || rec.Body.Len() == 0 {
			t.Errorf("GET %s: %d %q, want 200 %s", path, rec.Code, rec.Header().Get("Content-Type"), typ)
		}
		for k, v := range securityHeaders {
			if rec.Header().Get(k) != v {
				t.Errorf("GET %s: %s %q, want %q", path, k, rec.Header().Get(k), v)
			}
		}
		if again := serve(t, path, http.Header{"If-None-Match": {rec.Header().Get("ETag")}}); again.Code != http.StatusNotModified {
			t.Errorf("GET %s revalidated: %d, want 304", path, again.Code)
		}
	}
	for _, path := range []string{"/index.html", Prefix, Prefix + "index.html", Prefix + "nothing.js", "/x"} {
		if rec := serve(t, path, nil); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, rec.Code)
		}
	}
}

// The page names only its own origin's paths: no other host (a CDN, web fonts), which its
// Content-Security-Policy would refuse anyway, and every asset it names exists.
func TestPageLoadsOnlyItsOwnAssets(t *testing.T) {
	if !strings.Contains(securityHeaders["Content-Security-Policy"], "default-src 'self'") {
		t.Fatal("the Content-Security-Policy does not restrict the page to its origin")
	}
	remote := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(`)
	for path, f := range files {
		if m := remote.FindString(string(f.body)); m != "" {
			t.Errorf("%s names %q: the page must load nothing from another host", path, m)
		}
	}
	refs := regexp.MustCompile(`(?:src|href)="(/[^"]*)"`).FindAllStringSubmatch(string(files["/"].body), -1)
	if len(refs) < 2 {
		t.Fatalf("the page names %d assets, want its script and stylesheet", len(refs))
	}
	for _, r := range refs {
		if _, ok := files[r[1]]; !ok {
			t.Errorf("the page names %s, which is not served", r[1])
		}
	}
}
