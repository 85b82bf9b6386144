package version

import "testing"

func TestStringIsDevWithoutLinkerFlag(t *testing.T) {
	if got := String(); got != "dev" {
		t.Fatalf("String() = %q in a test binary built without -X, want dev", got)
	}
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--version"}, true},
		{[]string{"-version"}, true},
		{[]string{"serve", "--version"}, true},
		{[]string{"migrate", "--log-level=debug", "-version"}, true},
		{[]string{"--", "--version"}, false},
		{[]string{"--versions"}, false},
		{[]string{"--version=true"}, false},
		{[]string{"serve"}, false},
	} {
		if got := Requested(tc.args); got != tc.want {
			t.Errorf("Requested(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
