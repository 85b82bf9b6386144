package service

import (
	"io"
	"log/slog"
	"os"

	"lock.dev/internal/serve"
)

// Output is where a service's log goes: out, or os.Stdout when out is nil (a
// Config's LogOutput hook is nil in production).
func Output(out io.Writer) io.Writer {
	if out == nil {
		return os.Stdout
	}
	return out
}

// NewLogger is the service's logger: one JSON object per line on Output(out), each
// carrying service=name. A level other than debug, info, warn or error is a bad
// LOG_LEVEL (exit 2).
func NewLogger(out io.Writer, name, level string) (*slog.Logger, error) {
	return serve.NewLogger(Output(out), name, level)
}

// NewBatchedLogger is NewLogger for a service whose log is on the hot path: on
// stdout (out nil) its lines are batched by a serve.LogWriter, so that under load
// many lines go out in one write. closeLog writes what is left and must be called
// last; it does nothing when out was given.
func NewBatchedLogger(out io.Writer, name, level string) (logger *slog.Logger, closeLog func(), err error) {
	if out != nil {
		logger, err = serve.NewLogger(out, name, level)
		return logger, func() {}, err
	}
	lw := serve.NewLogWriter(os.Stdout)
	logger, err = serve.NewLogger(lw, name, level)
	if err != nil {
		_ = lw.Close()
		return nil, nil, err
	}
	return logger, func() { _ = lw.Close() }, nil
}

// CheckLogLevel refuses a LOG_LEVEL slog does not know, naming the setting.
func CheckLogLevel(level string) error {
	_, err := serve.NewLogger(io.Discard, "", level)
	return err
}
