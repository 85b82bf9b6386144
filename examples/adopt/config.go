package main

import (
	"errors"
	"flag"
	"io"
	"time"
)

// config is the program's settings, from its flags.
type config struct {
	lockServer   string        // lock-server's URL
	keysFile     string        // lock-server's JWK Set (jwks.json of `lock-server keygen`, or GET /v1/keys saved)
	databaseURL  string        // the ledger's PostgreSQL
	certsDir     string        // SVIDs and trust bundle; empty: plaintext
	unsafeNoAuth bool          // plaintext, said explicitly
	account      string        // the account both workers write to
	ttl          time.Duration // the workers' lease TTL
}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("adopt", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.lockServer, "lock-server", "", "lock-server's URL (https:// with -certs)")
	fs.StringVar(&c.keysFile, "keys", "", "lock-server's JWK Set file: the keys grants are verified with")
	fs.StringVar(&c.databaseURL, "db", "", "the ledger's PostgreSQL URL")
	fs.StringVar(&c.certsDir, "certs", "", "directory of ca.pem, executor.pem/.key and ledger.pem/.key (lock-server certs)")
	fs.BoolVar(&c.unsafeNoAuth, "unsafe-no-auth", false, "run plaintext, without workload identity (only without -certs)")
	fs.StringVar(&c.account, "account", "acct-7", "the account the workers write to")
	fs.DurationVar(&c.ttl, "ttl", 5*time.Second, "the workers' lease TTL")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.lockServer == "":
		return c, errors.New("-lock-server is required")
	case c.keysFile == "":
		return c, errors.New("-keys is required: without lock-server's keys no grant can be verified")
	case c.databaseURL == "":
		return c, errors.New("-db is required")
	case c.certsDir == "" && !c.unsafeNoAuth:
		return c, errors.New("-certs is required; -unsafe-no-auth runs plaintext, without workload identity")
	case c.certsDir != "" && c.unsafeNoAuth:
		return c, errors.New("-unsafe-no-auth and -certs contradict each other")
	}
	return c, nil
}
