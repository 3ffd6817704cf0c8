// Package ops holds what the hub and the minion share as programs, not as protocol: the
// duration and backoff types of their YAML files and the connections part of their limits
// (Connections, for package connlimit), strict YAML decoding, the HTTP server of their
// operational endpoints (with pprof; over TLS too, for the hub's admin listener; on a
// listener the caller opens, which marks a connection established once a request begins),
// and the watch of their configuration file.
//
// It knows nothing of MCP, clusters or sinks.
package ops

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/internal/connlimit"
)

// Duration is a time.Duration written as "10s" or "5m" in a configuration file. A value
// that does not parse is kept as an error that Check reports with the field's name, so the
// error names the field rather than only the value.
type Duration struct {
	time.Duration
	err error
}

// D returns a Duration of d.
func D(d time.Duration) Duration { return Duration{Duration: d} }

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		d.err = fmt.Errorf("%s is not a duration string like \"10s\"", b)
		return nil
	}
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.err = fmt.Errorf("%q is not a duration (want e.g. \"10s\", \"5m\")", s)
	case v < 0:
		d.err = fmt.Errorf("duration %q is negative", s)
	default:
		d.Duration, d.err = v, nil
	}
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Check returns the parse error of d, naming field.
func (d *Duration) Check(field string) error {
	if d != nil && d.err != nil {
		return fmt.Errorf("%s: %w", field, d.err)
	}
	return nil
}

// Backoff is a redial delay in a configuration file: exponential from Initial up to Max,
// with full jitter.
type Backoff struct {
	// Initial is the first delay's upper bound.
	Initial Duration `json:"initial,omitempty"`
	// Max caps the delays.
	Max Duration `json:"max,omitempty"`
}

// Check reports, naming field, a delay that does not parse, an Initial that is not
// positive or a Max below it.
func (b *Backoff) Check(field string) error {
	if err := b.Initial.Check(field + ".initial"); err != nil {
		return err
	}
	if err := b.Max.Check(field + ".max"); err != nil {
		return err
	}
	if b.Initial.Duration <= 0 {
		return fmt.Errorf("%s.initial: must be positive", field)
	}
	if b.Max.Duration < b.Initial.Duration {
		return fmt.Errorf("%s: max %v is below initial %v", field, b.Max.Duration, b.Initial.Duration)
	}
	return nil
}

// Connections is the part of the hub's and the minion's limits section that bounds the
// connections of their listeners before a peer has completed its handshake (package
// connlimit); each program's defaults are its own.
type Connections struct {
	// HandshakeTimeout closes a connection that has not completed its TLS handshake (on a
	// plaintext listener, sent its first bytes) within it. 0: none.
	HandshakeTimeout Duration `json:"handshakeTimeout"`
	// MaxPendingPerIP is how many connections one address (an IPv6 /64) may have in
	// handshake at once, on every listener of the process together; one more is closed as
	// it is accepted. 0: no cap.
	MaxPendingPerIP int `json:"maxPendingPerIP,omitempty"`
	// MaxConnections is how many connections the process holds at once, on every listener
	// together; one more is closed as it is accepted. 0: derived from the process's limit
	// of open files (connlimit.Derive).
	MaxConnections int `json:"maxConnections,omitempty"`
}

// Check reports, naming it under section, a field that does not parse or is negative.
func (c *Connections) Check(section string) error {
	if err := c.HandshakeTimeout.Check(section + ".handshakeTimeout"); err != nil {
		return err
	}
	if c.MaxPendingPerIP < 0 {
		return fmt.Errorf("%s.maxPendingPerIP: %d is negative (0 is no cap)", section, c.MaxPendingPerIP)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("%s.maxConnections: %d is negative (0 is derived from the limit of open files)", section, c.MaxConnections)
	}
	return nil
}

// Guard returns the connection bounds of c (connlimit.New), reporting to log and refused.
func (c Connections) Guard(log *slog.Logger, refused func(listener, reason string)) (*connlimit.Guard, error) {
	return connlimit.New(connlimit.Config{HandshakeTimeout: c.HandshakeTimeout.Duration, MaxPendingPerIP: c.MaxPendingPerIP, MaxConnections: c.MaxConnections},
		connlimit.Options{Logger: log, Refused: refused})
}

// DecodeStrict decodes YAML (or JSON) into v: duplicate keys and unknown fields are errors.
func DecodeStrict(data []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("not valid YAML: %v", err)
	}
	return DecodeJSONStrict(js, v)
}

// DecodeJSONStrict decodes JSON into v, unknown fields being errors: for a section's
// UnmarshalJSON that starts from the section's defaults. A value of the wrong type is
// reported with its field's path: "warmUp: want a string, not a number".
func DecodeJSONStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return &FieldError{Field: te.Field, Err: fmt.Errorf("want a %s, not a %s", te.Type, te.Value)}
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// FieldError is a problem with one field of a configuration file.
type FieldError struct {
	// Field is the field's path ("warmUp", "replicas.gossip").
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// InSection puts an error of a section's decoding under the section's name.
func InSection(section string, err error) error {
	if fe := (*FieldError)(nil); errors.As(err, &fe) {
		return &FieldError{Field: section + "." + fe.Field, Err: fe.Err}
	}
	return fmt.Errorf("%s: %w", section, err)
}

// AddPprof registers the pprof handlers under /debug/pprof/.
func AddPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// ServeHTTP serves h on lis in g until ctx ends (then shuts down, giving requests 5 s), and
// returns the bound address. lis is the caller's, typically a connlimit Guard's listener:
// a connection is marked established (connlimit.Established) once its first request has
// begun, and its headers must then arrive within 10 s.
func ServeHTTP(ctx context.Context, g *errgroup.Group, lis net.Listener, h http.Handler) string {
	return serveHTTP(ctx, g, lis, newHTTPServer(h))
}

// ServeHTTPS is ServeHTTP over TLS with config (which must give the server's certificate,
// e.g. by GetConfigForClient, and decides which client certificates it takes). A request's
// r.TLS is the connection's state. The server's own errors go to log (net/http would
// write them to the standard logger, outside the program's structured log): a failed
// handshake at debug, with the peer's address, as the configuration's verification reports
// the refusals it makes (meshtls.ServerConfigWith) and the other failures are peers going
// away mid-handshake (TCP probes); anything else at warn. The TLS handshake, like the
// headers, must end within 10 s.
func ServeHTTPS(ctx context.Context, g *errgroup.Group, lis net.Listener, h http.Handler, config *tls.Config, log *slog.Logger) string {
	srv := newHTTPServer(h)
	srv.ErrorLog = stdlog.New(httpErrorLog{log}, "", 0)
	return serveHTTP(ctx, g, tls.NewListener(lis, config), srv)
}

// newHTTPServer is the operational endpoints' server. ReadHeaderTimeout bounds both a
// request's headers and, over TLS, the handshake (net/http's handshake deadline is it).
// IdleTimeout closes a kept-alive connection that has been idle that long (without it one
// stays open for as long as its peer wants): Prometheus scrapes at most every minute or
// so and keeps its connection, a probe opens a new one each time.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateActive {
				connlimit.Established(c)
			}
		}}
}

// httpErrorLog writes an http.Server's error lines to a structured log (see ServeHTTPS).
type httpErrorLog struct{ log *slog.Logger }

func (w httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}

// serveHTTP serves srv on lis in g until ctx ends, and returns the bound address.
func serveHTTP(ctx context.Context, g *errgroup.Group, lis net.Listener, srv *http.Server) string {
	g.Go(func() error {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return lis.Addr().String()
}

// WatchFile follows the file at path until ctx ends. It calls changed with the file's
// content once the watch is up, so that a change made after the caller read the file is not
// lost, and then after each burst of changes to the file (settled for debounce) whose content
// differs from the last one passed: writes to other files of the directory, a touch or a save
// of the same bytes call nothing, so a refused content is judged once.
//
// The directory is watched, for the events that concern the file: editors replace it by a
// rename, and a Kubernetes ConfigMap mount (path a symlink through the ..data symlink) swaps
// ..data to a new directory, which a watch of the file itself would not see.
func WatchFile(ctx context.Context, path string, debounce time.Duration, log *slog.Logger, changed func(data []byte)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return err
	}
	name := filepath.Base(path)
	var last []byte // what changed was last given
	seen := false
	read := func() {
		data, err := os.ReadFile(path)
		switch {
		case err != nil:
			log.Warn("configuration file unreadable; keeping the running configuration", "path", path, "err", err)
		case seen && bytes.Equal(data, last):
			log.Debug("configuration file unchanged", "path", path)
		default:
			last, seen = data, true
			changed(data)
		}
	}
	read()
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if b := filepath.Base(ev.Name); b == name || b == "..data" {
				fire = time.After(debounce)
			}
		case err := <-w.Errors:
			log.Warn("config watcher error", "err", err)
		case <-fire:
			read()
		}
	}
}

// LoadFile reads a configuration file and parses it with parse; an error names the file.
func LoadFile[T any](path string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	data, err := os.ReadFile(path)
	if err != nil {
		return zero, err
	}
	v, err := parse(data)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// LogFormats are the formats NewLogger writes: JSON for machines (the default: log
// pipelines parse it), text (key=value) for people at a terminal.
var LogFormats = []string{"json", "text"}

// NewLogger returns the programs' logger writing to w at level (debug, info, warn or error)
// in format (one of LogFormats).
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want %s", format, strings.Join(LogFormats, " or "))
}

// Overlay returns base with each field o sets (non-zero) in its place: an item's override
// of a section of defaults, as a cluster's quotas over the hub's. With o nil, base. T is a
// struct of exported fields.
func Overlay[T any](base T, o *T) T {
	if o == nil {
		return base
	}
	dst, src := reflect.ValueOf(&base).Elem(), reflect.ValueOf(o).Elem()
	for i := range src.NumField() {
		if f := src.Field(i); !f.IsZero() {
			dst.Field(i).Set(f)
		}
	}
	return base
}
