package minion

import (
	"os"
	"syscall"
	"unsafe"
)

// setImmutable sets or clears path's immutable attribute (chattr +i): the file can then be
// neither opened for writing nor removed, nor a directory's entries changed, even by root.
func setImmutable(path string, on bool) error {
	const (
		getFlags  = 0x80086601 // FS_IOC_GETFLAGS
		setFlags  = 0x40086602 // FS_IOC_SETFLAGS
		immutable = 0x10       // FS_IMMUTABLE_FL
	)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var flags int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), getFlags, uintptr(unsafe.Pointer(&flags))); e != 0 {
		return e
	}
	if on {
		flags |= immutable
	} else {
		flags &^= immutable
	}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), setFlags, uintptr(unsafe.Pointer(&flags))); e != 0 {
		return e
	}
	return nil
}
