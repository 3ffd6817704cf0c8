package hub

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/meshfed/meshfed/hub/dashboard"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Whose eyes the admin API answers for. The http listener is the vendor's (Prometheus, the
// probes, the vendor's own tools: bind it where only the vendor reaches it), and so is every
// request in a hub without tenants. With tenants, a request over adminTLS is answered for
// the operator its certificate names: an operator a tenant lists sees that tenant only, in
// every answer (its clusters, its sinks, the objects it sees, who owns what: "not yours"
// for another tenant's), and acts on it only; an operator the top-level operators list is
// the vendor's and sees every tenant; any other operator, and a certificate that is not an
// operator's, reads nothing.

// viewer is who an answer is for: the vendor (tenant ""), who sees every tenant, or one
// tenant's operator.
type viewer struct {
	tenant string
	comp   *compiled
}

// vendor is the viewer who sees everything.
func vendor(comp *compiled) viewer { return viewer{comp: comp} }

func (v viewer) isVendor() bool { return v.tenant == "" }

// ownsCluster reports whether cluster is the viewer's to see and act on.
func (v viewer) ownsCluster(cluster string) bool {
	return v.isVendor() || v.comp.tenants.OfCluster(cluster) == v.tenant
}

// sees reports whether the viewer's tenant sees r (its own, or exported to it).
func (v viewer) sees(r *resource) bool {
	return v.isVendor() || v.comp.tenants.Sees(v.tenant, r.cluster, r.collection, r.namespace, r.labels)
}

// seesRoute reports whether a sink of rt is the viewer's.
func (v viewer) seesRoute(rt route) bool { return v.isVendor() || rt.tenant == v.tenant }

type viewerKey struct{}

// viewerOf is who r is answered for (set by viaAdminTLS; the vendor otherwise).
func (h *Hub) viewerOf(r *http.Request) viewer {
	v, ok := r.Context().Value(viewerKey{}).(viewer)
	if !ok {
		return vendor(h.current().comp)
	}
	return v
}

// tenantPaths are what a tenant's operator may ask: the answers filtered to its tenant.
// Everything else (metrics, state, replicas, pprof) is the vendor's.
var tenantPaths = []string{"/api/clusters", "/api/sinks", "/api/why", "/api/object", "/api/owners", "/api/dryrun", "/api/conflicts", "/api/kinds", "/api/tenants", "/api/events", "/api/overview", "/api/refusals", "/api/whoami", "/"}

// viaAdminTLS serves next as the adminTLS listener: its requests carry a client
// certificate that the handshake verified against the hub's bundle (meshtls refuses any
// other), operator takes an identity from no other request, and with tenants each request
// is answered for the operator it names (readScope).
func (h *Hub) viaAdminTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), adminTLSKey{}, true))
		v, refused := h.readScope(r)
		if refused != nil {
			h.log.Warn("admin request refused", "path", r.URL.Path, "peer", r.RemoteAddr, "status", refused.status, "reason", refused.msg)
			http.Error(w, refused.msg, refused.status)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), viewerKey{}, v)))
	})
}

// readScope is who an adminTLS request is answered for: the vendor in a hub without tenants
// or listed operators; otherwise the tenant its operator is bound to, or the vendor for an
// operator the top-level operators list. An operator listed nowhere and a certificate that
// is no operator's are refused, as is a tenant's operator asking for a path that is the
// vendor's.
func (h *Hub) readScope(r *http.Request) (viewer, *actionRefusal) {
	comp := h.current().comp
	if comp.vendorOps == nil { // no tenants, no operators listed: anyone verified reads
		return vendor(comp), nil
	}
	want := meshtls.ID(comp.trustDomain, meshtls.KindOperator, "NAME")
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return viewer{}, &actionRefusal{http.StatusUnauthorized, "with tenants, the admin API over adminTLS answers operators only: present a client certificate for " + want}
	}
	id, err := meshtls.PeerIdentity(r.TLS.PeerCertificates[0])
	if err != nil {
		return viewer{}, &actionRefusal{http.StatusForbidden, fmt.Sprintf("%v: with tenants, the admin API over adminTLS answers operators only (%s)", err, want)}
	}
	kind, name, err := meshtls.CheckID(comp.trustDomain, id)
	if err != nil {
		return viewer{}, &actionRefusal{http.StatusForbidden, fmt.Sprintf("identity %q is not an operator (not a SPIFFE ID of this hub: %v): with tenants, the admin API over adminTLS answers operators only (%s)", id, err, want)}
	}
	if kind != meshtls.KindOperator {
		return viewer{}, &actionRefusal{http.StatusForbidden, fmt.Sprintf("identity %q is not an operator: with tenants, the admin API over adminTLS answers operators only (%s)", id, want)}
	}
	v := viewer{tenant: comp.tenants.OfOperator(name), comp: comp}
	if v.isVendor() && !comp.vendorOps[name] {
		return viewer{}, &actionRefusal{http.StatusForbidden, fmt.Sprintf("operator %q is listed neither in operators (the vendor's) nor in a tenant's operators", name)}
	}
	if !v.isVendor() && !tenantPath(r.URL.Path) {
		return viewer{}, &actionRefusal{http.StatusForbidden, fmt.Sprintf("%s is the vendor's: operator %q of tenant %q may read %s, and act on its own clusters", r.URL.Path, name, v.tenant, strings.Join(tenantPaths, ", "))}
	}
	return v, nil
}

// tenantPath reports whether a tenant's operator may ask for path: one of tenantPaths, or
// an action on a cluster (which checks the cluster is the operator's).
func tenantPath(path string) bool {
	for _, p := range tenantPaths {
		if path == p {
			return true
		}
	}
	return strings.HasPrefix(path, "/api/clusters/") || strings.HasPrefix(path, dashboard.Prefix)
}
