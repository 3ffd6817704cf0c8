package tls

import (
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials returns gRPC server credentials for cfg (ServerConfig, ServerConfigWith
// or ServerOnlyConfig) that tell onReject, if not nil, of every handshake they refuse, with
// the peer's address: a client certificate ServerConfigWith refused, by its Reject* reason
// (its own onReject, if any, is told too), and a peer that does not speak TLS at all
// (RejectPlaintext), which gRPC would otherwise drop without a trace. A peer that goes
// away mid-handshake (a TCP health check) is not a refusal and is not reported.
func ServerCredentials(cfg *tls.Config, onReject func(peer net.Addr, reason string, err error)) credentials.TransportCredentials {
	return &serverCredentials{TransportCredentials: credentials.NewTLS(cfg), onReject: onReject}
}

type serverCredentials struct {
	credentials.TransportCredentials
	onReject func(peer net.Addr, reason string, err error)
}

func (c *serverCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	addr := raw.RemoteAddr()
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil && c.onReject != nil {
		if reason := handshakeRefusal(err); reason != "" {
			c.onReject(addr, reason, err)
		}
	}
	return conn, info, err
}

func (c *serverCredentials) Clone() credentials.TransportCredentials {
	return &serverCredentials{TransportCredentials: c.TransportCredentials.Clone(), onReject: c.onReject}
}

// handshakeRefusal names why a server handshake failed, or "" if it was not refused.
func handshakeRefusal(err error) string {
	var r *rejection
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &r):
		return r.reason
	case errors.As(err, &rh):
		return RejectPlaintext
	}
	return ""
}
