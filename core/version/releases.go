package version

// A Known release is one this build knows the storage formats of: the
// releases a cluster can be downgraded to are looked up here.
type Known struct {
	Version Version
	// Writes and Reads are the release's StorageFormat and
	// OldestStorageFormat.
	Writes, Reads int
	// Commit is the commit its tag names, so that a clone without the
	// tags (but with the history) can still build it: the upgrade test
	// does.
	Commit string
}

// Releases lists the releases before this one, oldest first; the release
// that adds a format appends itself here in the next one.
func Releases() []Known {
	return []Known{
		{Version: Version{Major: 0, Minor: 9}, Writes: 2, Reads: 1, Commit: "af32cfd7bcc03c49130abf69ebf0192f796dc918"},
	}
}

// Previous is the release one minor below v (the only downgrade target the
// rule allows), and whether this build knows it.
func Previous(v Version) (Known, bool) {
	for _, k := range Releases() {
		if k.Version.Major == v.Major && k.Version.Minor == v.Minor-1 {
			return k, true
		}
	}
	return Known{}, false
}

// Unrecorded is the version of a member that publishes no version record:
// 0.9.0, the last release before members published one.
func Unrecorded() Version { return Version{Major: 0, Minor: 9} }
