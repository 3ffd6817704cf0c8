//go:build !linux

package minion

import "errors"

func setImmutable(string, bool) error { return errors.ErrUnsupported }
