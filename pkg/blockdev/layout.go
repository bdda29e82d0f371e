package blockdev

// The data directory's layout, as far as the Store and the backends share
// it (the Store's doc lists the rest): a backend finds a volume's file by
// its ID, and the Store reads the ublk backend's device records to keep a
// directory's owner token across upgrades.
const (
	// VolumesDir holds the volume files, <data dir>/volumes/<id>.img.
	VolumesDir = "volumes"
	// ImageSuffix ends every volume and snapshot file name.
	ImageSuffix = ".img"
	// UblkStateDir holds the ublk backend's device records, one
	// <volume-id>.json per device.
	UblkStateDir = "ublk"
)
