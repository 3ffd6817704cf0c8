// Package dashboard is the hub's fleet dashboard: one HTML page, one script and one
// stylesheet, embedded in the binary and served by the hub's admin listeners (http and
// adminTLS) at "/". The page reads the admin API (package hub/api) from the same origin
// and polls it for live updates; everything it shows is what the API answers the
// request's viewer, so a tenant's operator sees the tenant's data only.
//
// It is not a second API and holds no state: the hub computes the summaries (hub's
// http_dashboard.go), the page draws them. It loads nothing from another host (no CDN, no
// web fonts), which its Content-Security-Policy enforces, and needs no build step: the
// script is plain JavaScript, read as written.
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"time"
)

//go:embed assets
var assets embed.FS

// Prefix is where the page's script and stylesheet are served; the page itself is "/".
const Prefix = "/dashboard/"

// securityHeaders are set on every answer: the page may load and connect to its own
// origin only (a request to any other host fails in the browser), no page may frame it,
// and it sends no referrer.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
	"X-Frame-Options":         "DENY",
	// Revalidated on every load (by the ETag), so a hub's upgrade is seen at once.
	"Cache-Control": "no-cache",
}

// file is one embedded asset, with the ETag of its content.
type file struct {
	name string
	body []byte
	etag string
}

// files are the assets by the path they are served at.
var files = func() map[string]file {
	out := map[string]file{}
	entries, err := fs.ReadDir(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	for _, e := range entries {
		body, err := assets.ReadFile(path.Join("assets", e.Name()))
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		f := file{name: e.Name(), body: body, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		if e.Name() == "index.html" {
			out["/"] = f
		} else {
			out[Prefix+e.Name()] = f
		}
	}
	return out
}()

// Handler serves the page at "/" and its assets under Prefix; any other path is 404.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		for k, v := range securityHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("ETag", f.etag)
		// ServeContent sets the type by the name, and answers If-None-Match with 304.
		http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
	})
}

// Mount registers Handler on mux for GET (and HEAD) of "/" exactly and of Prefix: the
// rest of the mux keeps its own answers (a GET of an action's path stays 405).
func Mount(mux *http.ServeMux) {
	h := Handler()
	mux.Handle("GET /{$}", h)
	mux.Handle("GET "+Prefix, h)
}
