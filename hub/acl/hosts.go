package acl

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// kind is a host-claiming Istio networking kind, or kindNone.
type kind uint8

const (
	kindNone kind = iota
	kindVirtualService
	kindServiceEntry
	kindDestinationRule
	kindGateway
	kindSidecar
)

// nsHosts reports whether the kind's hosts are "namespace/host" entries.
func (k kind) nsHosts() bool { return k == kindGateway || k == kindSidecar }

func (k kind) String() string {
	switch k {
	case kindVirtualService:
		return "VirtualService"
	case kindServiceEntry:
		return "ServiceEntry"
	case kindDestinationRule:
		return "DestinationRule"
	case kindGateway:
		return "Gateway"
	case kindSidecar:
		return "Sidecar"
	}
	return "none"
}

// kindOf classifies a collection by its last path element, within Istio's networking group,
// whatever the version:
//
//	istio/networking/<version>/virtualservices      (MCP collection names, Istio 1.4–1.8)
//	networking.istio.io/<version>/VirtualService    (group/version/Kind, as istiod's type URLs)
//
// Other groups' kinds with the same name (e.g. the Kubernetes Gateway API's gateways) carry
// other messages and are not host-claiming here.
func kindOf(collection string) kind {
	var kindName string
	plural := false
	if rest, ok := strings.CutPrefix(collection, "istio/networking/"); ok {
		kindName, plural = lastOfTwo(rest), true
	} else if rest, ok := strings.CutPrefix(collection, "networking.istio.io/"); ok {
		kindName = lastOfTwo(rest)
	} else {
		return kindNone
	}
	if plural {
		switch kindName {
		case "virtualservices":
			return kindVirtualService
		case "serviceentries":
			return kindServiceEntry
		case "destinationrules":
			return kindDestinationRule
		case "gateways":
			return kindGateway
		case "sidecars":
			return kindSidecar
		}
		return kindNone
	}
	switch kindName {
	case "VirtualService":
		return kindVirtualService
	case "ServiceEntry":
		return kindServiceEntry
	case "DestinationRule":
		return kindDestinationRule
	case "Gateway":
		return kindGateway
	case "Sidecar":
		return kindSidecar
	}
	return kindNone
}

// lastOfTwo returns b of "a/b" (a non-empty, no further "/"), else "".
func lastOfTwo(s string) string {
	v, k, ok := strings.Cut(s, "/")
	if !ok || v == "" || strings.IndexByte(k, '/') >= 0 {
		return ""
	}
	return k
}

// ClaimsHosts reports whether resources of collection claim hosts, that is whether Hosts
// decodes its bodies (and whether Check reads Object.Hosts as "namespace/host" entries:
// for Gateways and Sidecars).
func ClaimsHosts(collection string) bool { return kindOf(collection) != kindNone }

// Hosts returns the hosts a resource claims, as written in it. body is the serialized Istio
// message (the value bytes of the MCP Resource's Any body). Only the networking kinds that
// claim hosts are decoded, recognized by the collection's last path element in Istio's
// networking group ("istio/networking/<version>/<plural>" or
// "networking.istio.io/<version>/<Kind>"):
//
//	virtualservices   VirtualService.hosts
//	serviceentries    ServiceEntry.hosts
//	destinationrules  [DestinationRule.host]
//	gateways          every servers[].hosts entry ("namespace/host", as written)
//	sidecars          every egress[].hosts entry ("namespace/host", as written)
//
// The v1alpha3 Go types decode v1beta1 and v1 bodies too (same wire format). Any other
// collection returns nil, nil: its resources are checked by namespace alone. A body that
// does not decode returns an error naming the kind.
func Hosts(collection string, body []byte) ([]string, error) {
	k := kindOf(collection)
	m := messageOf(k)
	if m == nil {
		return nil, nil
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("acl: %s body (%s) does not decode: %w", k, collection, err)
	}
	out, _ := HostsOf(collection, m)
	return out, nil
}

// messageOf is a new message of the type Hosts decodes k's bodies as (nil: none).
func messageOf(k kind) proto.Message {
	switch k {
	case kindVirtualService:
		return &networking.VirtualService{}
	case kindServiceEntry:
		return &networking.ServiceEntry{}
	case kindDestinationRule:
		return &networking.DestinationRule{}
	case kindGateway:
		return &networking.Gateway{}
	case kindSidecar:
		return &networking.Sidecar{}
	}
	return nil
}

// HostsOf is Hosts of a body already decoded (ingest's check decodes every body once). ok
// is false when m is not the message Hosts decodes the collection's bodies as (a configured
// kind replacing a built-in collection): the caller then asks Hosts.
func HostsOf(collection string, m proto.Message) (hosts []string, ok bool) {
	var out []string
	switch k := kindOf(collection); m := m.(type) {
	case nil:
		return nil, k == kindNone
	case *networking.VirtualService:
		ok = k == kindVirtualService
		out = m.GetHosts()
	case *networking.ServiceEntry:
		ok = k == kindServiceEntry
		out = m.GetHosts()
	case *networking.DestinationRule:
		ok = k == kindDestinationRule
		out = []string{m.GetHost()}
	case *networking.Gateway:
		ok = k == kindGateway
		for _, s := range m.GetServers() {
			out = append(out, s.GetHosts()...)
		}
	case *networking.Sidecar:
		ok = k == kindSidecar
		for _, e := range m.GetEgress() {
			out = append(out, e.GetHosts()...)
		}
	default:
		ok = k == kindNone
	}
	if !ok || len(out) == 0 {
		return nil, ok
	}
	return out, true
}
