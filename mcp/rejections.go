package mcp

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Rejection is one resource a sink refused to apply, as a NACK reports it.
type Rejection struct {
	// Resource is the resource's metadata.name.
	Resource string
	// Reason says why, for a human (and for an Event on the source object).
	Reason string
	// Held: the resource's deletion was not applied, held by the sink (the hub's
	// mass-deletion breaker): the object stays served.
	Held bool
}

// HeldReason marks a held deletion's field violation (BadRequest.FieldViolation.reason).
const HeldReason = "DELETION_HELD"

// Partial acceptance. A NACK means, to any MCP source, "this push was not applied": Istio's
// sources keep what the sink last acknowledged and send the next version against it. A sink
// that applied all of a push but a few resources says so with an ErrorInfo detail
// (PartialReason in PartialDomain) next to the BadRequest naming the refused ones: the NACK
// is still a NACK on the wire (the refusal is reported, and a stock source stays correct),
// but this engine's sources take the push's version as acknowledged, so the refused
// resources are not resent with every later push, only when they change.
const (
	PartialDomain = "meshfed.io"
	PartialReason = "PARTIALLY_APPLIED"
)

// RejectionError builds the error an Applier returns to NACK a push it applied except for
// the resources it names. The NACK's error_detail then has code, a summary message, an
// ErrorInfo saying the rest was applied, and one google.rpc.BadRequest detail whose field
// violations are the rejections (field = resource name, description = reason), which
// Rejections reads back. Any gRPC peer can read it.
func RejectionError(code codes.Code, collection string, rejected []Rejection) error {
	br := &errdetails.BadRequest{}
	for _, r := range rejected {
		fv := &errdetails.BadRequest_FieldViolation{Field: r.Resource, Description: r.Reason}
		if r.Held {
			fv.Reason = HeldReason
		}
		br.FieldViolations = append(br.FieldViolations, fv)
	}
	msg := fmt.Sprintf("%s: %d resource(s) rejected", collection, len(rejected))
	if len(rejected) > 0 {
		msg += fmt.Sprintf("; first: %s: %s", rejected[0].Resource, rejected[0].Reason)
	}
	s, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: PartialReason, Domain: PartialDomain}, br)
	if err != nil { // only if the detail cannot be marshaled
		return status.Error(code, msg)
	}
	return s.Err()
}

// Rejections returns the per-resource rejections a NACK's error detail carries (see
// RejectionError); nil when it names none.
func Rejections(detail *rpcstatus.Status) []Rejection {
	if detail == nil {
		return nil
	}
	var out []Rejection
	for _, d := range status.FromProto(detail).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, Rejection{Resource: v.GetField(), Reason: v.GetDescription(), Held: v.GetReason() == HeldReason})
			}
		}
	}
	return out
}

// PartiallyApplied reports whether a NACK's error detail says the rest of the push was
// applied (see RejectionError).
func PartiallyApplied(detail *rpcstatus.Status) bool {
	if detail == nil {
		return false
	}
	for _, d := range status.FromProto(detail).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == PartialReason && ei.GetDomain() == PartialDomain {
			return true
		}
	}
	return false
}
