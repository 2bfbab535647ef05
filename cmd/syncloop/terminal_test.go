package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestScreen: elsewhere than a terminal, each block that changed is
// written whole, after a blank line, and a repeat is not; on a terminal,
// each block is drawn over the last, counting the rows a long line wraps
// to.
func TestScreen(t *testing.T) {
	var log bytes.Buffer
	s := &screen{w: &log}
	s.show("a\nb\n", "1")
	s.show("a\nb\n", "1")
	s.show("c\n", "2")
	if got, want := log.String(), "a\nb\n\nc\n"; got != want {
		t.Errorf("not a terminal: wrote %q, want %q", got, want)
	}

	var tty bytes.Buffer
	s = &screen{w: &tty, width: 10}
	s.show("short\n"+strings.Repeat("x", 25)+"\n", "1") // 1 row, then 3
	s.show("again\n", "1")
	s.show("last\n", "2")
	want := "short\n" + strings.Repeat("x", 25) + "\n" + "\033[4A\033[J" + "again\n" + "\033[1A\033[J" + "last\n"
	if got := tty.String(); got != want {
		t.Errorf("terminal: wrote %q, want %q", got, want)
	}
}

// TestStatusLine: each status replaces the one before on its line, cut to
// the terminal's width, and clear leaves the line empty for what follows.
func TestStatusLine(t *testing.T) {
	var b bytes.Buffer
	s := &statusLine{w: &b, width: 12}
	s.clear() // nothing shown: nothing to clear
	s.set("planning")
	s.set("planning 2 rules")
	s.clear()
	if got, want := b.String(), "\r\033[Kplanning\r\033[Kplanning 2…\r\033[K"; got != want {
		t.Errorf("wrote %q, want %q", got, want)
	}
	if got, want := planProgress(1, 40, 960), "planning 1 rule: 40 reconciles planned, 960 queued…"; got != want {
		t.Errorf("planProgress = %q, want %q", got, want)
	}
}
