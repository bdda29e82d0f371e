// Package fsstat reports on filesystems: usage and the read-only flag
// through statfs (Stat, of a mounted volume or the data directory), a
// volume file's allocated bytes, whether a directory still takes durable
// writes (ProbeWrite), ext4's own record of the errors it hit
// (Ext4Errors), and the size an unmounted ext filesystem records for itself
// (ReadExtSize).
package fsstat
