package blkdev

import "testing"

func TestParseDiskStats(t *testing.T) {
	// A line as the 6.x kernel prints it (17 fields).
	got, err := parseStats("    1200 3 9600 40 800 0 6400 50 2 70 90 10 0 80 1 5 6\n")
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{ReadIOs: 1200, ReadSectors: 9600, ReadTicksMs: 40, WriteIOs: 800, WriteSectors: 6400,
		WriteTicksMs: 50, InFlight: 2, IOTicksMs: 70, DiscardIOs: 10, DiscardSectors: 80, FlushIOs: 5}
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	// Old kernels print 11 fields; the rest stay zero.
	if _, err := parseStats("1 2 3 4 5 6 7 8 9 10 11"); err != nil {
		t.Errorf("11 fields: %v", err)
	}
	if _, err := parseStats("1 2 3"); err == nil {
		t.Error("3 fields: want an error")
	}
}
