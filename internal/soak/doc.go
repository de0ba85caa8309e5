// Package soak holds the soak test, behind the build tag soak: see
// soak_test.go and scripts/soak.sh.
package soak
