// Package backend turns volume files into block devices: Select picks the
// ublk backend where /dev/ublk-control exists and io_uring works, the loop
// backend otherwise (select.go), and the adapters map each device kind onto
// blockdev.Backend: ublk.go over the ublk server of package ublk, loop.go
// over the kernel loop devices of package loop. Both keep the stable links
// <dev dir>/<volume-id>, act only on devices that carry the data
// directory's owner token (package owner), and find them again after a
// restart. backendtest is the conformance suite both run.
package backend
