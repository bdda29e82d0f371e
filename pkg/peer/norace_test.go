//go:build !race

package peer

// raceEnabled: the race detector is on (race_test.go).
const raceEnabled = false
