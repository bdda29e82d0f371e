//go:build race

package peer

// raceEnabled: the race detector is on, and sync.Pool (gRPC's buffer pool)
// drops some of what it is given back on purpose.
const raceEnabled = true
