//go:build !ablation

package dataplane

// Ablation is empty without -tags ablation: every technique of the server
// threads is on, and each switch below is a constant the compiler folds
// away (ablation_on.go has them for benchmarks).
type Ablation struct{}

func (Ablation) submitEach() bool     { return false }
func (Ablation) reapOne() bool        { return false }
func (Ablation) batchWait() bool      { return false }
func (Ablation) timedBatch() bool     { return false }
func (Ablation) ringOrder() bool      { return false }
func (Ablation) threadNice() bool     { return false }
func (Ablation) plainRing() bool      { return false }
func (Ablation) unbounded() bool      { return false }
func (Ablation) noFixedFiles() bool   { return false }
func (Ablation) noFixedBuffers() bool { return false }
func (Ablation) handOff() bool        { return false }
func (Ablation) noOffer() bool        { return false }

// TracksChanges says whether devices get a change record: always.
func (Ablation) TracksChanges() bool { return true }
