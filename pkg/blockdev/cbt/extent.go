package cbt

import (
	"cmp"
	"math"
	"slices"
)

// Extent is a byte range [Offset, Offset+Length) of a volume.
type Extent struct {
	Offset int64 `json:"o"`
	Length int64 `json:"n"`
}

// End is the first byte after the extent, saturating at math.MaxInt64.
func (e Extent) End() int64 {
	if e.Length > math.MaxInt64-e.Offset {
		return math.MaxInt64
	}
	return e.Offset + e.Length
}

// Normalize sorts exts by offset and merges those that overlap or touch,
// dropping empty and negative ones. It reuses exts' array.
func Normalize(exts []Extent) []Extent {
	exts = slices.DeleteFunc(exts, func(e Extent) bool { return e.Length <= 0 || e.Offset < 0 })
	slices.SortFunc(exts, func(a, b Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	out := exts[:0]
	for _, e := range exts {
		if n := len(out); n > 0 && e.Offset <= out[n-1].End() {
			last := &out[n-1]
			if end := e.End(); end > last.End() {
				last.Length = end - last.Offset
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// Union returns the normalized union of the extent lists, in a new slice.
func Union(lists ...[]Extent) []Extent {
	var all []Extent
	for _, l := range lists {
		all = append(all, l...)
	}
	return Normalize(all)
}

// Clip returns the parts of the normalized exts that lie in [from, to), in a
// new slice.
func Clip(exts []Extent, from, to int64) []Extent {
	var out []Extent
	for _, e := range exts {
		start, end := max(e.Offset, from), min(e.End(), to)
		if start < end {
			out = append(out, Extent{Offset: start, Length: end - start})
		}
	}
	return out
}

// Total is the number of bytes the normalized exts cover.
func Total(exts []Extent) int64 {
	var n int64
	for _, e := range exts {
		n += e.Length
	}
	return n
}
