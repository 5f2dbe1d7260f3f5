package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/jobs"
)

func runKey(_ context.Context, args []string, stdio cli.IO, _ func(string) string) error {
	fs := cli.NewFlagSet("key", "publisher key [[--tenant T] --conversation C --turn N --tool T [--ordinal K] --args JSON] [--material]\n\n"+
		"With --args, prints the key of that one call. Without it, reads job bodies as JSON\n"+
		"Lines on standard input (only conversation_id, turn_index, tool, ordinal and args\n"+
		"are needed; a tenant, when there is one) and prints, for each line in order, its key or 'error: <reason>'.", stdio)
	var call jobs.Call
	var argsJSON string
	fs.StringVar(&call.ConversationID, "conversation", "", "conversation id")
	fs.Int64Var(&call.TurnIndex, "turn", 0, "turn index (non-negative)")
	fs.StringVar(&call.Tool, "tool", "", "tool name")
	fs.Int64Var(&call.Ordinal, "ordinal", 0, "position of the call among identical calls of the turn")
	fs.StringVar(&argsJSON, "args", "", "the call's arguments, a JSON object")
	fs.StringVar(&call.Tenant, "tenant", "", "the tenant whose call it is (its material starts with \"tenant|\"); leave it out for the default tenant's call")
	material := fs.Bool("material", false, "print the exact hashed material instead of the key")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if err := cli.RefuseEmpty(fs, "tenant", "for the default tenant's key"); err != nil {
		return err
	}
	argsSet := false
	var fields []string // the call's field flags given
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "args":
			argsSet = true
		case "tenant", "conversation", "turn", "tool", "ordinal":
			fields = append(fields, "--"+f.Name)
		}
	})
	if !argsSet && len(fields) > 0 {
		// Without --args the calls are read from standard input, each with
		// its own fields: the flags would be ignored.
		return cli.Usagef("%s without --args: give the call's --args too, or leave the fields to the job bodies on standard input", strings.Join(fields, " "))
	}
	if argsSet {
		call.Args = []byte(argsJSON)
		line, err := keyLine(call, *material)
		if err != nil {
			return cli.WithCode(cli.ExitRejected, err)
		}
		fmt.Fprintln(stdio.Out, line)
		return nil
	}
	return keysFromJSONLines(stdio.In, stdio.Out, *material)
}

// keysFromJSONLines prints a key (or material) for each input line, or
// "error: <reason>" for a line that is rejected, and fails at the end if any
// line was.
func keysFromJSONLines(in io.Reader, out io.Writer, material bool) error {
	r := bufio.NewReader(in)
	w := bufio.NewWriter(out)
	defer w.Flush()
	rejected := 0
	for n := 1; ; n++ {
		line, readErr := r.ReadBytes('\n')
		if len(line) == 0 && readErr != nil {
			if errors.Is(readErr, io.EOF) {
				break
			}
			return readErr
		}
		line = bytes.TrimRight(line, "\r\n")
		var text string
		call, err := jobs.DecodeCall(line)
		if err == nil {
			text, err = keyLine(call, material)
		}
		if err != nil {
			rejected++
			text = "error: " + err.Error()
		}
		fmt.Fprintln(w, text)
		if readErr != nil {
			break
		}
	}
	if rejected > 0 {
		w.Flush()
		return cli.WithCode(cli.ExitRejected, fmt.Errorf("%d line(s) rejected", rejected))
	}
	return nil
}

func keyLine(call jobs.Call, material bool) (string, error) {
	m, err := call.Material()
	if err != nil {
		return "", err
	}
	if material {
		return m.Text, nil
	}
	return m.Key(), nil
}
