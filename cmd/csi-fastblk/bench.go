package main

import (
	"context"
	"errors"
)

// Placeholder until the owning work lands.
func runBench(ctx context.Context, args []string) error { return errors.New("bench: not built yet") }
