package api

import (
	"encoding/json"
	"time"
)

// The documents of GET /api/object: what the hub serves of a collection, or of one object
// of it, to the viewer's tenant (answered as /api/why is: a tenant's operator sees only
// what its tenant's sinks may see). 400 when the collection is not one the hub serves; 404
// when the viewer sees no cluster's copy of the object and none of its clusters' copies was
// refused (another tenant's object is answered as a missing one).
//
//	/api/object?collection=C            ObjectList: every object of C served to the viewer
//	/api/object?collection=C&name=NS/N  Object: its served content and every cluster's copy

// ObjectList is every object of a collection served to the viewer's tenant (to the vendor,
// each tenant's served copy), by name.
type ObjectList struct {
	Collection string `json:"collection"`
	// APIVersion and Kind are the collection's Kubernetes group/version and kind.
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Items      []ObjectSummary `json:"items"`
}

// ObjectSummary is one served object of a list.
type ObjectSummary struct {
	// Name is namespace/name, or name for a cluster-scoped kind.
	Name string `json:"name"`
	// Cluster is the cluster whose copy is served, Version the served version
	// (<cluster>/<version as received>).
	Cluster string `json:"cluster"`
	Version string `json:"version"`
	// Created is the object's creation time as its source sent it (absent when it sent
	// none).
	Created *time.Time `json:"created,omitempty"`
	// Candidates counts the clusters' copies the viewer sees (more than one: a conflict).
	Candidates int `json:"candidates"`
}

// Object is one object as the hub serves it to the viewer's tenant, and every cluster's
// copy the viewer sees.
type Object struct {
	Collection string `json:"collection"`
	Name       string `json:"name"`
	// Served is the served copy's content, nil when no copy is served (every copy the viewer
	// sees is held, or the only ones were refused).
	Served *Manifest `json:"served"`
	// Candidates and Rejected are as in Why: each cluster's copy (the served one first),
	// and the copies the viewer's clusters had refused.
	Candidates []Candidate `json:"candidates"`
	Conflict   string      `json:"conflict,omitempty"`
	Rejected   []Refused   `json:"rejected"`
}

// Manifest is a served object written as Kubernetes writes its objects: the body decoded
// from its protobuf message (the kind's, or a Struct for a kind without one) as the spec.
type Manifest struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   ManifestMeta `json:"metadata"`
	// Spec is the body as protobuf's JSON mapping writes it.
	Spec json.RawMessage `json:"spec"`
}

// ManifestMeta is a served object's metadata: the MCP resource's, with the hub's origin
// annotation and the served version (<cluster>/<version as received>).
type ManifestMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	ResourceVersion   string            `json:"resourceVersion"`
	CreationTimestamp *time.Time        `json:"creationTimestamp,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}
