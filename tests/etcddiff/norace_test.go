//go:build !race

package etcddiff

const raceEnabled = false
