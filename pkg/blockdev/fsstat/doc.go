// Package fsstat reports on filesystems: usage through statfs (of a mounted
// volume, Stat; of the data directory, StatDir), a volume file's allocated
// bytes, whether a directory still takes durable writes (ProbeWrite), and
// ext4's own record of the errors it hit (Ext4Errors).
package fsstat
