package minion

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// healthyStream is how long a stream must stay up for the next failure to restart the
// backoff from its initial delay.
const healthyStream = 10 * time.Second

// redial keeps a stream up: it dials addrs in turn and runs stream on each connection,
// waiting between failures with exponential backoff and full jitter, capped at b.Max.
// It returns when ctx ends.
// onEnd, if not nil, is told how each attempt ended.
func redial(ctx context.Context, addrs []string, creds credentials.TransportCredentials, b BackoffConfig, log *slog.Logger, onEnd func(addr string, err error),
	stream func(ctx context.Context, conn *grpc.ClientConn) error) {
	delay := b.Initial.Duration
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
		if time.Since(start) >= healthyStream {
			delay = b.Initial.Duration
		}
		wait := time.Duration(rand.Int64N(int64(delay) + 1)) // full jitter
		log.Warn("stream ended; reconnecting", "addr", addr, "err", err, "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		delay = min(delay*2, b.Max.Duration)
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
