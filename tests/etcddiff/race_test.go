//go:build race

package etcddiff

const raceEnabled = true
