//go:build !linux

package connlimit

import (
	"net"
	"time"
)

// setUserTimeout does nothing off Linux, as gRPC's does not.
func setUserTimeout(net.Conn, time.Duration) {}
