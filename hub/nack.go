package hub

import (
	"errors"

	"google.golang.org/grpc/codes"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
)

// checkReason is the class (api.Reason*) of an ownership check's refusal: an object refused
// for what it is (an invalid host) is invalid, whoever sent it; any other is not owned.
func checkReason(err error) string {
	if r, ok := errors.AsType[*acl.Rejection](err); ok && r.Invalid {
		return api.ReasonInvalid
	}
	return api.ReasonNotOwned
}

// nackCode is the one gRPC code of a NACK whose refusals are of the classes reasons (an
// api.Reason* each) and, if held, that also names deletions the breaker holds. Each
// refused resource keeps its own reason in the NACK's BadRequest; the code says what the
// push as a whole needs, the most lasting first:
//
//   - PermissionDenied: an object the cluster may not publish. Sending it again changes
//     nothing until the hub's ownership does; that is a decision about who publishes
//     what, so it is what the code tells first (and what it told before invalid
//     refusals had a code of their own, so an alert on it keeps its meaning).
//   - InvalidArgument: an object that is not valid whoever sends it (its body does not
//     decode as its kind, its name or a host is not one): the source must change it.
//   - ResourceExhausted: over a quota of the cluster's or its tenant's; it comes in once
//     there is room.
//   - FailedPrecondition: the breaker holds deletions until an operator releases them.
//   - AlreadyExists: only conflicts, which are stored and served if the winner goes away.
func nackCode(reasons []string, held bool) codes.Code {
	has := map[string]bool{}
	for _, r := range reasons {
		has[r] = true
	}
	switch {
	case has[api.ReasonNotOwned]:
		return codes.PermissionDenied
	case has[api.ReasonInvalid]:
		return codes.InvalidArgument
	case has[api.ReasonOverQuota]:
		return codes.ResourceExhausted
	case held:
		return codes.FailedPrecondition
	}
	return codes.AlreadyExists
}
