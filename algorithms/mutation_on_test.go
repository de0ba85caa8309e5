//go:build mutation

package algorithms

// mutationOn reports that the tests run built with the tag mutation, as
// scripts/mutation.sh builds them: every mutant runs the whole package's
// tests, so the long runs are cut as under the race detector (see
// raceOn), and the adaptive controller's simulations run one upstream
// each. A mutant the long runs would catch and the cut ones miss lives
// there, so a figure is never better for the cut.
const mutationOn = true
