package patroni

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func (c *Cluster) writeConfig(n *node) error {
	socket := filepath.Join(c.dir, "s"+strings.TrimPrefix(n.name, "pg"))
	if err := os.Mkdir(socket, 0o700); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	if err := c.own(socket, 0o700); err != nil {
		return err
	}
	secs := func(d time.Duration) int { return max(1, int(d.Round(time.Second)/time.Second)) }
	sync := "true"
	if c.opts.Async {
		sync = "false"
	}
	// docs/operations/high-availability.md's Patroni settings, on loopback. The
	// pitfalls this configuration avoids: initdb's own pg_hba lines come first, so auth-host must not be trust;
	// each member has its own pgpass and socket directory; mode "off" is a
	// string (the YAML boolean is rejected by --validate-config); etcd 3.4 serves
	// the v3 API only (etcd3); a standby retries a missing slot after
	// wal_retrieve_retry_interval, which strict mode waits for.
	yml := fmt.Sprintf(`scope: %[1]s
namespace: /service/
name: %[2]s

restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d

etcd3:
  hosts: 127.0.0.1:%[4]d

bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    maximum_lag_on_failover: %[18]d
    synchronous_mode: %[8]s
    synchronous_mode_strict: %[8]s
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_connections: 150
        shared_buffers: 32MB
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 128MB
        wal_log_hints: "on"
        wal_retrieve_retry_interval: 1s
        synchronous_commit: "on"
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
  - data-checksums
  - auth-host: scram-sha-256
  - auth-local: trust
  pg_hba:
  - local all all trust
  - host replication replicator 127.0.0.1/32 scram-sha-256
  - host all all 127.0.0.1/32 scram-sha-256

postgresql:
  listen: 127.0.0.1:%[9]d
  connect_address: 127.0.0.1:%[9]d
  data_dir: %[10]s
  bin_dir: %[11]s
  pgpass: %[12]s
  authentication:
    replication:
      username: replicator
      password: %[13]s
    superuser:
      username: %[14]s
      password: %[15]s
    rewind:
      username: rewind_user
      password: %[16]s
  parameters:
    unix_socket_directories: %[17]s

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false

watchdog:
  mode: "off"
`, c.scope(), n.name, n.restPort, c.etcdClient, secs(c.opts.TTL), secs(c.opts.LoopWait), secs(c.opts.RetryTimeout), sync,
		n.pgPort, n.data, c.bin, filepath.Join(c.dir, n.name+".pgpass"), replPass, superuser, superPass, rewindPass, socket, c.maxLag())
	if err := os.WriteFile(n.config, []byte(yml), 0o600); err != nil {
		return fmt.Errorf("patroni: write %s: %w", n.config, err)
	}
	return c.own(n.config, 0o600)
}
