package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// HealthyStream is how long a stream must stay up for the next failure to restart
// Redial's backoff from its initial delay.
const HealthyStream = 10 * time.Second

// Backoff is an exponential backoff with full jitter.
type Backoff struct {
	// Initial is the first delay's upper bound; Max caps the delays.
	Initial, Max time.Duration
}

// Redial keeps one client stream up until ctx ends: it dials addrs in turn (a new gRPC
// connection each attempt, with creds) and runs stream on the connection, waiting between
// attempts with exponential backoff and full jitter, reset after a stream that lasted
// HealthyStream. onEnd, if not nil, is told how each attempt ended. b must have a positive
// Initial and a Max no smaller (the configurations that give it check both).
func Redial(ctx context.Context, addrs []string, creds credentials.TransportCredentials, b Backoff, log *slog.Logger,
	onEnd func(addr string, err error), stream func(ctx context.Context, conn *grpc.ClientConn) error) {
	if len(addrs) == 0 {
		return
	}
	if b.Initial <= 0 || b.Max < b.Initial {
		panic(fmt.Sprintf("mcp.Redial: backoff %+v: want 0 < Initial <= Max", b)) // a caller's bug: it would redial in a tight loop
	}
	delay := b.Initial
	for i := 0; ctx.Err() == nil; i++ {
		addr := addrs[i%len(addrs)]
		start := time.Now()
		err := dialOnce(ctx, addr, creds, stream)
		if ctx.Err() != nil {
			return
		}
		if onEnd != nil {
			onEnd(addr, err)
		}
		if time.Since(start) >= HealthyStream {
			delay = b.Initial
		}
		wait := time.Duration(rand.Int64N(int64(delay) + 1)) // full jitter
		log.Warn("stream ended; reconnecting", "addr", addr, logError, err, "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		delay = min(delay*2, b.Max)
	}
}

func dialOnce(ctx context.Context, addr string, creds credentials.TransportCredentials, stream func(context.Context, *grpc.ClientConn) error) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	return stream(ctx, conn)
}
