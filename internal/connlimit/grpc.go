package connlimit

import (
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials returns creds (TLS) marking each connection established once its
// handshake has succeeded (Established): a gRPC listener's handshake is its transport
// credentials'. A plaintext gRPC listener has none to wait for: give it
// ListenerOptions.FirstBytes instead. The HTTP/2 preface that follows the handshake is
// bounded by gRPC's own connection timeout (grpc.ConnectionTimeout).
func ServerCredentials(creds credentials.TransportCredentials) credentials.TransportCredentials {
	return &serverCredentials{TransportCredentials: creds}
}

// GRPCConnectionTimeout is the gRPC server's connection timeout (grpc.ConnectionTimeout,
// 120 s by default) for a Guard's handshake timeout d: it bounds the HTTP/2 preface after
// the TLS handshake, which the Guard does not see. Twice d: the Guard's own deadline, set
// at accept, then closes a stalled handshake first, and that close is counted and logged
// as handshake_timeout rather than as one more failed handshake.
func GRPCConnectionTimeout(d time.Duration) time.Duration { return 2 * d }

type serverCredentials struct {
	credentials.TransportCredentials
}

func (c *serverCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err == nil {
		Established(raw)
	}
	return conn, info, err
}

func (c *serverCredentials) Clone() credentials.TransportCredentials {
	return &serverCredentials{TransportCredentials: c.TransportCredentials.Clone()}
}
