package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshfed/meshfed/hub/api"
	meshtls "github.com/meshfed/meshfed/tls"
)

// conn is how a command reaches the hub's admin API: its flags, shared by every command
// that reads or acts.
type conn struct {
	addr, cert, key, ca, serverName string
}

func (c *conn) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&c.addr, "admin", "", "the hub's admin address: its http listener (default 127.0.0.1:9990), or with --cert its adminTLS listener (default 127.0.0.1:9991)")
	fs.StringVar(&c.cert, "cert", "", "a client certificate: talk to the hub's adminTLS listener (https) with it; actions need an operator's (spiffe://<td>/operator/NAME; hub certs issue --operator NAME)")
	fs.StringVar(&c.key, "key", "", "with --cert: its key")
	fs.StringVar(&c.ca, "ca", "", "with --cert: the trust bundle the hub's certificate must chain to")
	fs.StringVar(&c.serverName, "server-name", "", "with --cert: the name the hub's certificate must carry, instead of --admin's host")
}

// client is a client of the hub's admin API.
type client struct {
	base string
	http *http.Client
}

// client is a client of the hub's admin API at c.addr: over http, or with a certificate
// over https (the adminTLS listener), verifying the hub's certificate against the bundle.
func (c *conn) client() (*client, error) {
	if c.cert == "" {
		if c.key != "" || c.ca != "" || c.serverName != "" {
			return nil, errors.New("--key, --ca and --server-name go with --cert (a client certificate, for the hub's adminTLS listener)")
		}
		addr, err := adminAddr(c.addr, "http", api.DefaultHTTPAddr)
		if err != nil {
			return nil, err
		}
		return &client{base: "http://" + addr, http: &http.Client{Timeout: 10 * time.Second}}, nil
	}
	switch {
	case c.key == "":
		return nil, errors.New("--key: required with --cert")
	case c.ca == "":
		return nil, errors.New("--ca: required with --cert (the bundle the hub's certificate must chain to)")
	}
	addr, err := adminAddr(c.addr, "https", api.DefaultAdminTLSAddr)
	if err != nil {
		return nil, err
	}
	src, err := meshtls.NewSource(meshtls.Files{Cert: c.cert, Key: c.key, CA: c.ca}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, fmt.Errorf("--cert/--key/--ca: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: src.ClientConfig(c.serverName)}
	return &client{base: "https://" + addr, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

// adminAddr is --admin's HOST:PORT (def when empty). A URL is taken as people paste it
// when its scheme is the one this connection speaks (http, or https with --cert); another
// scheme, a path or a missing port is an error naming what to give.
func adminAddr(given, scheme, def string) (string, error) {
	if given == "" {
		return def, nil
	}
	addr := given
	if s, rest, ok := strings.Cut(given, "://"); ok {
		if s != scheme {
			if scheme == "https" {
				return "", fmt.Errorf("--admin %q: with --cert the hub's adminTLS listener is asked over https", given)
			}
			return "", fmt.Errorf("--admin %q: without --cert the hub's http listener is asked over http (give --cert, --key and --ca for its adminTLS listener)", given)
		}
		addr = strings.TrimSuffix(rest, "/")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "/") {
		return "", fmt.Errorf("--admin %q: want HOST:PORT (the hub's admin listener), e.g. 127.0.0.1:9990", given)
	}
	return addr, nil
}

// NotFoundError is the hub's answer that what was asked for does not exist (or is not the
// asker's to see: the hub answers both alike). It prints as kubectl prints its own.
type NotFoundError struct{ Msg string }

func (e *NotFoundError) Error() string { return "Error from server (NotFound): " + e.Msg }

// BusyError is the hub's answer that it is evaluating as much of what was asked as it takes
// at once (429: a dry run of a candidate, one at a time): ask again after RetryAfter.
type BusyError struct {
	Msg        string
	RetryAfter time.Duration
}

func (e *BusyError) Error() string { return "429 Too Many Requests: " + e.Msg }

// call sends method path (with body) and decodes the answer's JSON into v; it returns the
// answer as sent, for -o json|yaml.
func (c *client) call(ctx context.Context, method, path string, body []byte, v any) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the hub's admin API at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	msg := strings.TrimSpace(string(b))
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		return nil, errors.New(msg) // the hub's word on what the request got wrong
	case resp.StatusCode == http.StatusNotFound && msg == "404 page not found":
		return nil, fmt.Errorf("%s %s: the hub has no such endpoint (a hub older than this command?)", method, path)
	case resp.StatusCode == http.StatusNotFound:
		return nil, &NotFoundError{msg}
	case resp.StatusCode == http.StatusTooManyRequests:
		after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || after < 0 {
			after = 1
		}
		return nil, &BusyError{Msg: msg, RetryAfter: time.Duration(after) * time.Second}
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, msg)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("%s %s: the hub's answer: %w", method, path, err)
		}
	}
	return b, nil
}
