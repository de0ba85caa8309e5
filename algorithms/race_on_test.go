//go:build race

package algorithms

// raceOn reports that the race detector is on. The package runs no
// goroutines, so the detector can find nothing in its tests while it
// slows them about tenfold: the long runs (property traces, the rate
// precision grid) are cut under it, and .ci/run runs the package again
// without -race, at full length.
const raceOn = true
