package patroni

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Members asks the members' REST APIs for the cluster (GET /cluster), the first
// that answers.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var lastErr error
	for _, n := range c.nodes {
		ms, err := c.members(ctx, n)
		if err == nil {
			return ms, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("patroni: no member answered /cluster: %w", lastErr)
}

func (c *Cluster) members(ctx context.Context, n *node) ([]Member, error) {
	var body struct {
		Members []struct {
			Name  string          `json:"name"`
			Role  string          `json:"role"`
			State string          `json:"state"`
			Host  string          `json:"host"`
			Port  int             `json:"port"`
			Lag   json.RawMessage `json:"lag"`
		} `json:"members"`
	}
	if err := c.rest(ctx, n, http.MethodGet, "/cluster", nil, &body); err != nil {
		return nil, err
	}
	out := make([]Member, 0, len(body.Members))
	for _, m := range body.Members {
		lag := int64(-1)
		if v, err := strconv.ParseInt(string(m.Lag), 10, 64); err == nil {
			lag = v
		} else if m.Role == "leader" {
			lag = 0
		}
		out = append(out, Member{Name: m.Name, Role: m.Role, State: m.State, Host: m.Host, Port: m.Port, Lag: lag})
	}
	return out, nil
}

// rest calls a member's REST API, bounded by restTimeout.
func (c *Cluster) rest(ctx context.Context, n *node, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("patroni: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", n.restPort, path), body)
	if err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("patroni: %s %s on %s: %s: %s", method, path, n.name, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("patroni: %s %s on %s: %w", method, path, n.name, err)
		}
	}
	return nil
}

func byRole(ms []Member, role string) (Member, bool) {
	for _, m := range ms {
		if m.Role == role {
			return m, true
		}
	}
	return Member{}, false
}

// Leader is the member Patroni reports as leader now.
func (c *Cluster) Leader(ctx context.Context) (Member, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	if m, ok := byRole(ms, "leader"); ok {
		return m, nil
	}
	return Member{}, fmt.Errorf("patroni: no leader among %v", ms)
}

// SyncStandby is the member Patroni reports as synchronous standby now.
func (c *Cluster) SyncStandby(ctx context.Context) (Member, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return Member{}, err
	}
	if m, ok := byRole(ms, "sync_standby"); ok {
		return m, nil
	}
	return Member{}, fmt.Errorf("patroni: no synchronous standby among %v", ms)
}
