// Package filecopy copies volume files: a reflink where the filesystem
// shares extents (xfs with reflink=1, btrfs), a sparse-aware copy that
// keeps holes holes everywhere else, and a resync that makes an earlier copy
// equal to its source again by writing only the blocks that differ.
// MakeFile's copy is durable (fsynced, with its directory entry) when it
// returns; CopyFile's and ResyncFile's are durable once SyncFile says so,
// which lets a caller sync after it has released a held source, or not at
// all for a copy that lives only while it is open.
//
// It knows files only: which volume is copied, and whether it is held
// steady meanwhile, is the store's business.
package filecopy
