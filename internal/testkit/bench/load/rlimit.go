package load

import "syscall"

// RaiseNoFile raises the soft limit of open files to the hard limit (5,000 sinks are 5,000
// sockets on each side) and returns the limit now in force. Go's os package does the same at
// start since Go 1.19; this says so explicitly and reports the figure.
func RaiseNoFile() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, err
		}
	}
	return l.Cur, nil
}
