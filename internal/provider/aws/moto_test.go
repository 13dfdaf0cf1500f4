package aws_test

import (
	"os"
	"testing"

	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
	"github.com/vpcni/vpcni/internal/provider/providertest"
	"github.com/vpcni/vpcni/internal/testbed/mototest"
)

var motoURL string

func TestMain(m *testing.M) { os.Exit(mototest.Main(m, "provider-aws", &motoURL)) }

// motoLacks is where moto_server 5.2.1 is not EC2, as measured over HTTP
// (the AWS fact sheet's case IDs); the lab's EC2 endpoint runs those
// tests, following EC2's documentation.
var motoLacks = providertest.Lacks{
	Exhaustion:      "moto never runs out: it hands out addresses past a subnet's size, its free count going negative, and has no per-ENI limit (EX2, EX3, AP6)",
	UniqueAddresses: "moto picks each address at random over the whole CIDR without checking what other ENIs — or its own earlier picks in the same call — hold (EX2, EX4)",
	TakenCheck:      "moto assigns an address another ENI holds without AllowReassignment, and both ENIs then hold it (AP4)",
	ExactAnswers:    "moto's AssignPrivateIpAddresses answer lists every address on the ENI, not the new ones (AP1), so an address a person adds while vpcni's call is in flight looks like vpcni's",
}

func motoEndpoint() *ec2test.Endpoint {
	s := &mototest.Server{URL: motoURL}
	return &ec2test.Endpoint{URL: motoURL, Client: s.Client(), Lacks: motoLacks}
}

// TestContractMoto runs the provider contract against moto_server, an EC2
// implementation nobody here wrote, through the real Go SDK.
func TestContractMoto(t *testing.T) { motoEndpoint().Run(t) }
