package driver

// SetKept records the volumes this node keeps though no claim uses them
// (CSI ID to why), for its status: the node found them at start.
func (d *Driver) SetKept(kept map[string]string) {
	d.keptMu.Lock()
	d.keptVolumes = kept
	d.keptMu.Unlock()
}

// VolumeIDs are the CSI IDs of this node's volumes.
func (d *Driver) VolumeIDs() []string {
	var ids []string
	for _, v := range d.store.Volumes() {
		ids = append(ids, d.publicID(v.ID))
	}
	return ids
}

func (d *Driver) kept() map[string]string {
	d.keptMu.Lock()
	defer d.keptMu.Unlock()
	return d.keptVolumes
}
