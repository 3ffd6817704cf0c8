package hub

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/meshfed/meshfed/hub/api"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Actions: the admin API's requests that change the hub (releasing a breaker). Reading the
// API changes nothing, so anyone who reaches a listener may read it; an action needs an
// authenticated operator. Each action is registered through action, which asks operator
// who is acting and logs the answer, so that an action cannot skip the check; operator is
// the one place that decides.
//
// Where: actions are taken over adminTLS, the admin API behind mutual TLS, from a verified
// certificate whose identity is spiffe://<trustDomain>/operator/<name>. The plain http
// listener stays for Prometheus and the kubelet's probes, which present no certificate,
// and takes no action, except in development mode (insecure), where nobody is
// authenticated and actions are taken from a loopback peer only. devCA is not development
// mode: its peers have certificates, and so do its operators (`hub certs issue -operator`).

// DevOperator is who an action accepted in development mode is recorded as: a loopback
// peer of the http listener, not an authenticated person.
const DevOperator = "loopback (development mode)"

// adminTLSKey marks, in a request's context, that it came through the adminTLS listener.
type adminTLSKey struct{}

// AdminTLSAddr returns the bound adminTLS address ("" until Run has opened it, or when it
// is off).
func (h *Hub) AdminTLSAddr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.adminAddr
}

// actionRefusal is why a request may not act: the HTTP status (401: it presented no
// identity; 403: the one it presented, or where it came from, may not act) and what it
// needs.
type actionRefusal struct {
	status int
	msg    string
}

// crossOrigin refuses a browser's cross-origin POST (by its Sec-Fetch-Site or Origin
// header): a page the operator visits must not act through the operator's browser, which
// may hold the certificate or be on the loopback development mode trusts. The CLI sends
// neither header.
var crossOrigin = http.NewCrossOriginProtection()

// operator decides who is acting in r, or refuses it: the one place that does. who names
// the requester for the log either way (the certificate's identity, or that there is
// none).
func (h *Hub) operator(r *http.Request) (operator, who string, refused *actionRefusal) {
	td := h.current().comp.trustDomain
	want := meshtls.ID(td, meshtls.KindOperator, "NAME")
	if td == "" {
		want = "spiffe://<trustDomain>/operator/NAME"
	}
	via, _ := r.Context().Value(adminTLSKey{}).(bool)
	var idErr error
	switch {
	case via && r.TLS != nil && len(r.TLS.PeerCertificates) > 0:
		who, idErr = meshtls.PeerIdentity(r.TLS.PeerCertificates[0])
		if idErr != nil {
			who = fmt.Sprintf("none (%v)", idErr)
		}
	case h.cfg.Insecure:
		who = "none (development mode)"
	default:
		who = "none (the http listener carries no certificate)"
	}
	if err := crossOrigin.Check(r); err != nil {
		return "", who, &actionRefusal{http.StatusForbidden, "a browser's cross-origin request cannot act on the hub: " + err.Error()}
	}
	switch {
	case via:
		// Validation makes adminTLS need a trust domain, and the handshake a certificate.
		if idErr != nil {
			return "", who, &actionRefusal{http.StatusForbidden, fmt.Sprintf("%v: actions need a client certificate for %s", idErr, want)}
		}
		// Only the canonical spelling is an operator (meshtls.CheckID): a path that would
		// normalize to another (operator/alice/../../cluster/west) is none.
		if kind, _, err := meshtls.CheckID(td, who); err != nil {
			return "", who, &actionRefusal{http.StatusForbidden, fmt.Sprintf("identity %q is not an operator (not a SPIFFE ID of this hub: %v): actions need a client certificate for %s", who, err, want)}
		} else if kind != meshtls.KindOperator {
			return "", who, &actionRefusal{http.StatusForbidden, fmt.Sprintf("identity %q is not an operator: actions need a client certificate for %s", who, want)}
		}
		return who, who, nil
	case h.cfg.Insecure:
		if !loopbackPeer(r.RemoteAddr) {
			return "", who, &actionRefusal{http.StatusForbidden, fmt.Sprintf("development mode (insecure) authenticates nobody, so it takes actions from a loopback peer only; %s is not one", r.RemoteAddr)}
		}
		// A page in a browser can reach loopback by a name it controls that resolves to
		// 127.0.0.1 (DNS rebinding), and then its requests are not cross-origin: only a
		// request addressed to loopback itself is the operator's.
		if !loopbackHost(r.Host) {
			return "", who, &actionRefusal{http.StatusForbidden, fmt.Sprintf("development mode (insecure) takes actions addressed to a loopback address only (127.0.0.1, ::1, localhost), not %q", r.Host)}
		}
		return DevOperator, who, nil
	case h.cfg.AdminTLS != "":
		return "", who, &actionRefusal{http.StatusUnauthorized, fmt.Sprintf("actions need an authenticated operator: a client certificate for %s, over adminTLS (%s), not the http listener", want, h.AdminTLSAddr())}
	default:
		return "", who, &actionRefusal{http.StatusUnauthorized, fmt.Sprintf("this hub takes no actions: they need an operator's client certificate (%s) over adminTLS, which its configuration does not set", want)}
	}
}

// loopbackPeer reports whether addr (a request's RemoteAddr, host:port) is 127.0.0.0/8 or
// ::1 (an IPv4 address mapped into IPv6 counts as IPv4).
func loopbackPeer(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// loopbackHost reports whether host (a request's Host, with or without a port) names
// loopback: an address of it, or localhost.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// action registers an action on mux: pattern is "POST /path" (actions are POST, so that a
// GET, which proxies, crawlers and browsers send freely, never acts; the mux answers other
// methods with 405), and do runs only for the operator that operator finds, who is passed
// to it. Every accepted or refused action is logged with who and from where.
func (h *Hub) action(mux *http.ServeMux, pattern string, do func(w http.ResponseWriter, r *http.Request, operator string)) {
	if !strings.HasPrefix(pattern, http.MethodPost+" ") {
		panic(fmt.Sprintf("hub: action %q: an action's pattern is POST /path", pattern))
	}
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		what := r.Method + " " + r.URL.Path
		op, who, refused := h.operator(r)
		if refused != nil {
			h.log.Warn("admin action refused", "action", what, "identity", who, "peer", r.RemoteAddr, "status", refused.status, "reason", refused.msg)
			http.Error(w, refused.msg, refused.status)
			return
		}
		h.log.Info("admin action by an operator", "action", what, "operator", op, "peer", r.RemoteAddr)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		do(rec, r, op)
		h.log.Info("admin action done", "action", what, "operator", op, "peer", r.RemoteAddr, "status", rec.status)
	})
}

// statusRecorder keeps the status an action answered with, for its log line.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap gives http.ResponseController the connection's writer (an action may set its
// deadlines: a dry run's body must arrive in time).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// releaseBreaker is POST /api/clusters/{name}/breaker/release: it applies the deletions
// the cluster's breaker holds (404: no such cluster, or another tenant's, answered alike;
// 409: it holds none).
func (h *Hub) releaseBreaker(w http.ResponseWriter, r *http.Request, operator string) {
	name := r.PathValue("name")
	if !h.viewerOf(r).ownsCluster(name) {
		http.Error(w, fmt.Errorf("%w: %q", ErrUnknownCluster, name).Error(), http.StatusNotFound)
		return
	}
	var req api.BreakerReleaseRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		http.Error(w, "the body must be {\"digest\": DIGEST}, the breaker's digest you reviewed: "+err.Error(), http.StatusBadRequest)
		return
	}
	rel, err := h.ReleaseBreaker(name, operator, req.Digest)
	var changed *HeldChangedError
	switch {
	case errors.Is(err, ErrUnknownCluster):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errors.Is(err, ErrNothingHeld), errors.As(err, &changed):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, ErrNotDurable):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		WriteJSON(w, rel)
	}
}
