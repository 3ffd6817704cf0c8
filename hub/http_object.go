package hub

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/hub/api"
)

// GET /api/object: what the hub serves of a collection, or of one object of it, as the
// viewer may see it (the same eyes as /api/why: a tenant's operator sees its tenant's sinks'
// objects only, and another tenant's object is answered exactly as a missing one).

// serveObject answers /api/object.
func (h *Hub) serveObject(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("collection") == "" {
		http.Error(w, "give ?collection=COLLECTION, and &name=NAMESPACE/NAME for one object", http.StatusBadRequest)
		return
	}
	coll, err := h.servedCollection(q.Get("collection"))
	if err != nil {
		http.Error(w, "collection: "+err.Error(), http.StatusBadRequest)
		return
	}
	v := h.viewerOf(r)
	name := q.Get("name")
	if name == "" {
		WriteJSON(w, h.objectList(v, coll))
		return
	}
	o, err := h.object(v, coll, name)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if o.Served == nil && len(o.Candidates) == 0 && len(o.Rejected) == 0 {
		http.Error(w, fmt.Sprintf("%s %q not found", coll, name), http.StatusNotFound)
		return
	}
	WriteJSON(w, o)
}

// objectList lists the copies of coll served to v's tenant (to the vendor, every tenant's
// served copy), by name.
func (h *Hub) objectList(v viewer, coll string) api.ObjectList {
	k, _ := v.comp.kindTable.Lookup(coll)
	out := api.ObjectList{Collection: coll, APIVersion: apiVersion(k.Group, k.Version), Kind: k.Kind, Items: []api.ObjectSummary{}}
	s := h.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, cands := range s.index[coll] {
		seen := 0
		var served []*resource
		for _, r := range cands {
			if !v.sees(r) {
				continue
			}
			seen++
			if s.pickLocked(s.viewedTenant(v, r), coll, name) == r {
				served = append(served, r)
			}
		}
		for _, r := range served {
			item := api.ObjectSummary{Name: name, Cluster: r.cluster, Version: r.served.Version, Candidates: seen}
			if !r.created.IsZero() {
				t := r.created
				item.Created = &t
			}
			out.Items = append(out.Items, item)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool {
		if out.Items[i].Name != out.Items[j].Name {
			return out.Items[i].Name < out.Items[j].Name
		}
		return out.Items[i].Cluster < out.Items[j].Cluster
	})
	return out
}

// viewedTenant is the tenant whose served copy v is shown for r: v's own, or, for the
// vendor, that of r's cluster.
func (s *store) viewedTenant(v viewer, r *resource) string {
	if v.isVendor() {
		return s.tenants.OfCluster(r.cluster)
	}
	return v.tenant
}

// object is coll/name as v sees it: why's candidates and refusals, and the served copy's
// content.
func (h *Hub) object(v viewer, coll, name string) (api.Object, error) {
	w := h.whyServed(v, coll, name)
	o := api.Object{Collection: coll, Name: name, Candidates: w.Candidates, Conflict: w.Conflict, Rejected: w.Rejected}
	if w.Served == nil {
		return o, nil
	}
	s := h.store
	s.mu.Lock()
	var entry []byte
	for _, r := range s.index[coll][name] {
		if r.cluster == w.Served.Cluster {
			entry = r.served.Encoded
		}
	}
	s.mu.Unlock()
	if entry == nil {
		return o, nil // withdrawn since why looked: nothing served now
	}
	m, err := h.manifest(coll, entry)
	if err != nil {
		return o, fmt.Errorf("%s %s from cluster %s: %w", coll, name, w.Served.Cluster, err)
	}
	o.Served = m
	return o, nil
}

// manifest writes a served MCP resource (its wire form) as a Kubernetes-style object, the
// body decoded through the kind's message.
func (h *Hub) manifest(coll string, encoded []byte) (*api.Manifest, error) {
	var res mcpapi.Resource
	if err := proto.Unmarshal(encoded, &res); err != nil {
		return nil, err
	}
	table := h.current().comp.kindTable
	body, err := table.Decode(coll, &res)
	if err != nil {
		return nil, err
	}
	spec, err := protojson.MarshalOptions{}.Marshal(body)
	if err != nil {
		return nil, err
	}
	k, _ := table.Lookup(coll)
	md := res.GetMetadata()
	m := &api.Manifest{APIVersion: apiVersion(k.Group, k.Version), Kind: k.Kind, Spec: json.RawMessage(spec),
		Metadata: api.ManifestMeta{Name: md.GetName(), ResourceVersion: md.GetVersion(), Labels: md.GetLabels(), Annotations: md.GetAnnotations()}}
	if ns, n, ok := strings.Cut(md.GetName(), "/"); ok {
		m.Metadata.Namespace, m.Metadata.Name = ns, n
	}
	if ct := md.GetCreateTime(); ct != nil {
		t := ct.AsTime()
		m.Metadata.CreationTimestamp = &t
	}
	return m, nil
}

// apiVersion is Kubernetes' apiVersion of a group and version ("v1" for the core group).
func apiVersion(group, version string) string {
	if group == "" {
		return version
	}
	return group + "/" + version
}
