//go:build !mutation

package algorithms

// mutationOn reports that the tests run built with the tag mutation (see
// mutation_on_test.go).
const mutationOn = false
