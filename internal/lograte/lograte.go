// Package lograte keeps a line that can repeat per peer from flooding a log: a peer in a
// tight retry loop is refused thousands of times a second, and one line per refusal costs
// more than the refusal. A Limiter lets one line per key through per interval and counts
// the ones it held back, for the next line to report.
//
// It decides only whether to log; what is logged, and the metrics that count every
// occurrence, are the caller's.
package lograte

import (
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// DefaultInterval is the interval callers use unless they have a reason not to: a peer
// refused for the same reason is logged once a minute, with the count in between.
const DefaultInterval = time.Minute

// maxKeys bounds the keys remembered; a forgotten key is logged on its next occurrence.
const maxKeys = 65536

// Limiter lets through one line per key per interval. It is safe for concurrent use.
type Limiter struct {
	interval time.Duration
	now      func() time.Time
	keys     *lru.Cache[string, *keyState]
}

type keyState struct {
	mu         sync.Mutex // guards the following fields
	last       time.Time
	suppressed int
}

// New returns a Limiter letting one line per key through per interval (DefaultInterval
// if interval is not positive), on the clock now (time.Now if nil).
func New(interval time.Duration, now func() time.Time) *Limiter {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if now == nil {
		now = time.Now
	}
	keys, _ := lru.New[string, *keyState](maxKeys) // only fails for a size <= 0
	return &Limiter{interval: interval, now: now, keys: keys}
}

// Allow reports whether a line for key may be logged now and, if so, how many lines for
// key it held back since the last one it let through.
func (l *Limiter) Allow(key string) (ok bool, suppressed int) {
	s, found := l.keys.Get(key)
	if !found {
		s = &keyState{}
		if prev, had, _ := l.keys.PeekOrAdd(key, s); had {
			s = prev
		}
	}
	now := l.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.last.IsZero() && now.Sub(s.last) < l.interval {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	return true, n
}
