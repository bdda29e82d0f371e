package driver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fastblk/csi-fastblk/pkg/blockdev"
)

// toStatus maps an error from blockdev (or the mount layer) to the gRPC code
// the CSI spec names. Errors that already carry a status pass through.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, blockdev.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, blockdev.ErrConflict):
		return codes.AlreadyExists
	case errors.Is(err, blockdev.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, blockdev.ErrNoSpace):
		return codes.ResourceExhausted
	case errors.Is(err, blockdev.ErrOutOfRange):
		return codes.OutOfRange
	case errors.Is(err, blockdev.ErrBusy):
		return codes.FailedPrecondition
	case errors.Is(err, blockdev.ErrNotSupported):
		return codes.FailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

func invalid(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}

func precondition(format string, args ...any) error {
	return status.Error(codes.FailedPrecondition, fmt.Sprintf(format, args...))
}

func notFound(format string, args ...any) error {
	return status.Error(codes.NotFound, fmt.Sprintf(format, args...))
}
