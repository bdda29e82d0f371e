package cbt

import (
	"math"
	"slices"
	"testing"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Extent
		want []Extent
	}{
		{"empty", nil, nil},
		{"sorted and merged", []Extent{{10, 5}, {0, 5}, {5, 5}, {30, 1}}, []Extent{{0, 15}, {30, 1}}},
		{"contained", []Extent{{0, 100}, {10, 5}}, []Extent{{0, 100}}},
		{"empty and negative dropped", []Extent{{0, 0}, {-5, 10}, {3, -1}, {7, 1}}, []Extent{{7, 1}}},
		{"open-ended", []Extent{{10, math.MaxInt64 - 10}, {20, 5}, {0, 10}}, []Extent{{0, math.MaxInt64}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Normalize(slices.Clone(tc.in)); !slices.Equal(got, tc.want) {
				t.Fatalf("Normalize(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestClip(t *testing.T) {
	exts := []Extent{{0, 10}, {20, 10}, {40, math.MaxInt64 - 40}}
	if got, want := Clip(exts, 5, 45), []Extent{{5, 5}, {20, 10}, {40, 5}}; !slices.Equal(got, want) {
		t.Fatalf("Clip = %v, want %v", got, want)
	}
	if got := Clip(exts, 10, 20); got != nil {
		t.Fatalf("Clip of a gap = %v", got)
	}
	if Total(exts[:2]) != 20 {
		t.Fatal("Total")
	}
}
