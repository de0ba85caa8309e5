//go:build !race

package algorithms

// raceOn reports that the race detector is on (see race_on_test.go).
const raceOn = false
