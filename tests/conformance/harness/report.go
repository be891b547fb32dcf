package main

// One line per check on stdout; a failed prerequisite stops the scenario (abort).

import (
	"fmt"
	"strconv"
)

type report struct {
	prefix         string
	passed, failed int
}

// errAbort unwinds the scenario after a failed prerequisite.
type errAbort struct{ name string }

func (r *report) pass(name, format string, args ...any) {
	r.passed++
	fmt.Printf("%s PASS %s: %s\n", r.prefix, name, fmt.Sprintf(format, args...))
}

func (r *report) fail(name, format string, args ...any) {
	r.failed++
	fmt.Printf("%s FAIL %s: %s\n", r.prefix, name, fmt.Sprintf(format, args...))
}

func (r *report) info(format string, args ...any) {
	fmt.Printf("%s INFO %s\n", r.prefix, fmt.Sprintf(format, args...))
}

// check records ok as a pass or a failure and returns ok.
func (r *report) check(name string, ok bool, format string, args ...any) bool {
	if ok {
		r.pass(name, format, args...)
	} else {
		r.fail(name, format, args...)
	}
	return ok
}

// require is check, but a failure ends the scenario: later steps depend on this one.
func (r *report) require(name string, ok bool, format string, args ...any) {
	if !r.check(name, ok, format, args...) {
		panic(errAbort{name})
	}
}

// noErr checks that err is nil.
func (r *report) noErr(name string, err error, okDetail string) bool {
	if err != nil {
		r.fail(name, "unexpected error: %v", err)
		return false
	}
	r.pass(name, "%s", okDetail)
	return true
}

func (r *report) mustNoErr(name string, err error, okDetail string) {
	if !r.noErr(name, err, okDetail) {
		panic(errAbort{name})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
