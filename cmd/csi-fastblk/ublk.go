package main

import (
	"context"
	"errors"
)

// Placeholder until the owning work lands.
func runUblk(ctx context.Context, args []string) error { return errors.New("ublk: not built yet") }
