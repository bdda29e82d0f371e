package blockdev

import "errors"

// Error classes. Every error returned by this package and its backends wraps
// one of these, so that callers can classify with errors.Is.
var (
	// ErrNotFound: the volume, snapshot or device does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: an object with that name exists with other parameters.
	ErrConflict = errors.New("exists with different parameters")
	// ErrInvalid: the request itself is malformed.
	ErrInvalid = errors.New("invalid argument")
	// ErrNoSpace: the data directory cannot hold what was asked for.
	ErrNoSpace = errors.New("insufficient capacity")
	// ErrOutOfRange: a size outside what the volume or source allows.
	ErrOutOfRange = errors.New("size out of range")
	// ErrBusy: the object is in use (attached, or has dependants).
	ErrBusy = errors.New("in use")
	// ErrNotSupported: the kernel or backend cannot do this.
	ErrNotSupported = errors.New("not supported")
)
