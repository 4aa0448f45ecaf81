package mvcc

import (
	"testing"

	release "github.com/engramkv/engram/core/version"
)

// TestFormatsAreTheReleasesFormats: the formats this package writes and
// reads are the ones core/version publishes (`engram version`, the member
// records and the downgrade check rely on them), so a new record format
// cannot ship without its version change.
func TestFormatsAreTheReleasesFormats(t *testing.T) {
	if versionFormat != release.StorageFormat {
		t.Errorf("mvcc writes version records in format %d, core/version says %d", versionFormat, release.StorageFormat)
	}
	if recordFormat != release.OldestStorageFormat {
		t.Errorf("mvcc's oldest readable format is %d, core/version says %d", recordFormat, release.OldestStorageFormat)
	}
	old := encodeObject(Version{ModRev: 5, CreateRev: 4, Version: 2}, []byte("v"))
	old = append([]byte{recordFormat, old[1]}, old[2:len(old)-2]...) // drop the sub revision
	old = append(old, 'v')
	if h, v, err := decodeHeader(old); err != nil || h.ModRev != 5 || h.Sub != subUnknown || string(v) != "v" {
		t.Errorf("a format-%d record reads as %+v %q %v", release.OldestStorageFormat, h, v, err)
	}
	if _, _, err := decodeHeader([]byte{release.StorageFormat + 1, 0, 1, 1, 1, 0, 0}); err == nil {
		t.Errorf("a record in format %d, newer than this build writes, was read", release.StorageFormat+1)
	}
}
