package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// Long CLI work shows how it goes on a terminal, and stays quiet where its
// output is read by a program: a line that each report replaces (plan), a
// block redrawn in place (trace --watch).

// terminalWidth is the width of the terminal w writes to, or 0 when w
// writes elsewhere.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0
	}
	if width, _, err := term.GetSize(int(f.Fd())); err == nil && width > 0 {
		return width
	}
	return 80
}

// fit cuts text to width columns (runes), so that it takes one line.
func fit(text string, width int) string {
	if r := []rune(text); width > 1 && len(r) >= width {
		return string(r[:width-2]) + "…"
	}
	return text
}

// statusLine is one line on a terminal that each set replaces; clear
// takes it away before other output follows. Not safe for concurrent use.
type statusLine struct {
	w     io.Writer
	width int
	shown bool
}

func (s *statusLine) set(text string) {
	fmt.Fprintf(s.w, "\r\033[K%s", fit(text, s.width))
	s.shown = true
}

func (s *statusLine) clear() {
	if s.shown {
		fmt.Fprint(s.w, "\r\033[K")
		s.shown = false
	}
}

// screen shows a block of text that changes over time. On a terminal it
// redraws the block in place; elsewhere it writes each block that differs
// from the last, whole, after a blank line, so that a log keeps every
// change and none twice.
type screen struct {
	w     io.Writer
	width int    // the terminal's; 0 when w is not one
	lines int    // on a terminal: rows the block takes on the screen
	last  string // the key of the block written last
}

// show writes text unless key is the last one shown (on a terminal, text
// is drawn again anyway: what it shows may age).
func (s *screen) show(text, key string) {
	if s.width == 0 {
		if key == s.last {
			return
		}
		if s.last != "" {
			fmt.Fprintln(s.w)
		}
		s.last = key
		fmt.Fprint(s.w, text)
		return
	}
	if s.lines > 0 {
		fmt.Fprintf(s.w, "\033[%dA\033[J", s.lines) // up to the block's first line; erase to the end
	}
	s.last = key
	s.lines = 0
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		s.lines += max(1, (len([]rune(line))+s.width-1)/s.width) // a long line wraps
	}
	fmt.Fprint(s.w, text)
}
