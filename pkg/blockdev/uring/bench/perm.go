package bench

// blockPerm visits the blocks [0, n) in a pseudo-random order, each block
// once per pass and a new order every pass, as fio's default random map
// does for random I/O: within a pass no block is written twice. (Uniform
// draws repeat blocks, and on a disk that serialises overlapping writes
// that alone cost a visible share of the IOPS fio measures there; see
// docs/benchmark-studies.md, "Figures behind code comments".)
//
// The order is a 4-round Feistel network over the smallest even number of
// bits that covers n; indices that map past n are skipped (cycle walking),
// so it needs no memory per block.
type blockPerm struct {
	n    uint64
	half uint   // bits per Feistel half
	i    uint64 // position within the pass
	keys [4]uint64
	seed uint64
}

func newBlockPerm(n, seed uint64) *blockPerm {
	p := &blockPerm{n: max(n, 1), half: 1, seed: seed}
	for uint64(1)<<(2*p.half) < p.n {
		p.half++
	}
	p.rekey()
	return p
}

// next returns the next block of the pass, starting a new pass (with new
// keys) after the last.
func (p *blockPerm) next() uint64 {
	for {
		if p.i == uint64(1)<<(2*p.half) {
			p.i = 0
			p.rekey()
		}
		x := p.permute(p.i)
		p.i++
		if x < p.n {
			return x
		}
	}
}

func (p *blockPerm) permute(x uint64) uint64 {
	mask := uint64(1)<<p.half - 1
	l, r := x>>p.half, x&mask
	for _, k := range p.keys {
		l, r = r, l^(mix(r^k)&mask)
	}
	return l<<p.half | r
}

func (p *blockPerm) rekey() {
	for i := range p.keys {
		p.seed = mix(p.seed + 0x9e3779b97f4a7c15)
		p.keys[i] = p.seed
	}
}

// mix is splitmix64's finaliser.
func mix(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}
