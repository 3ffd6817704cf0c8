package mcp

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors of the engine. Wrap them with %w; StatusCode maps them to gRPC codes at the
// boundary.
var (
	// ErrInvalidResource: a resource cannot be encoded or decoded, or lacks metadata.name.
	ErrInvalidResource = errors.New("invalid resource")
	// ErrMalformed: a message from the peer is not valid protobuf for its type.
	ErrMalformed = errors.New("malformed message")
	// ErrUnknownCollection: a push names a collection that was not requested.
	ErrUnknownCollection = errors.New("collection not requested")
	// ErrTooLarge: a push would exceed the configured maximum message size.
	ErrTooLarge = errors.New("message too large")
	// ErrRateLimited: a peer opened streams faster than allowed.
	ErrRateLimited = errors.New("too many new streams from this peer")
	// ErrTooManyStreams: a peer has as many streams open as it may (MaxStreamsPerPeer).
	ErrTooManyStreams = errors.New("too many open streams from this peer")
	// ErrNotReady: the server has nothing whole to serve yet (ServerConfig.Ready).
	ErrNotReady = errors.New("not ready to serve")
	// ErrIdle: a stream's peer sent nothing within the idle timeout.
	ErrIdle = errors.New("idle stream")
	// ErrRejected: the sink's Applier refused a push.
	ErrRejected = errors.New("push rejected")
)

// StatusCode maps an engine error to the gRPC code a peer should see.
func StatusCode(err error) codes.Code {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s.Code()
	}
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, ErrInvalidResource), errors.Is(err, ErrMalformed), errors.Is(err, ErrRejected):
		return codes.InvalidArgument
	case errors.Is(err, ErrUnknownCollection):
		return codes.Unimplemented // as Istio's sink answers
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrRateLimited), errors.Is(err, ErrTooManyStreams):
		return codes.ResourceExhausted
	case errors.Is(err, ErrNotReady):
		return codes.Unavailable
	case errors.Is(err, ErrIdle):
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}

// toStatus converts err into a gRPC status, keeping the status (and its details) when err
// already carries one.
func toStatus(err error) *status.Status {
	if s, ok := status.FromError(err); ok {
		return s
	}
	return status.New(StatusCode(err), err.Error())
}
