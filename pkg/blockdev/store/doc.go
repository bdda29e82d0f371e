// Package store keeps csi-fastblk's volumes and snapshots under one data
// directory: a sparse file and an atomically replaced record per object
// (store.go lists the layout), the capacity left to promise (capacity.go),
// and the exclusive lock that keeps a second plugin off the directory
// (lock.go).
//
// Records are the truth (record.go): an object exists once its record is
// durable and stops existing when the record is removed; Open removes what
// a crash left half-made and sets aside records it cannot read. Volumes are
// created, cloned and expanded in volume.go, snapshots taken and deleted in
// snapshot.go; a copy of a volume in use is held steady only while it
// catches up (Hold; package quiesce makes the holds, package filecopy the
// copies). Each snapshot keeps the record of the ranges its volume changed
// since the one before (changes.go, filled from the device's tracker of
// package cbt), from which Delta answers without reading data when every
// record is trusted, comparing the files when not (delta.go).
//
// The Store knows neither devices nor CSI: detaching is a callback of
// DeleteVolume, and errors wrap the classes of package blockdev. It is safe
// for concurrent use and holds no open files between calls.
package store
