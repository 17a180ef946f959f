// Cosmos DB for NoSQL: the account (serverless by default, Entra ID only), the database and the
// containers the library expects (agent_learning.store.cosmos: CONTAINERS and LEASES). The
// containers are created here because a managed identity cannot create them at run time.

@description('Name of the Cosmos DB account (3-44 lowercase letters, digits and hyphens).')
@minLength(3)
@maxLength(44)
param accountName string

@description('Name of the database (AGENT_LEARNING_COSMOS_DATABASE).')
param databaseName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object = {}

@description('Serverless bills per request and storage only; Provisioned gives the database shared autoscale throughput.')
@allowed([
  'Serverless'
  'Provisioned'
])
param capacityMode string = 'Serverless'

@description('Autoscale maximum RU/s of the database when capacityMode is Provisioned (it scales between 10% and 100% of it).')
@minValue(1000)
param autoscaleMaxThroughput int = 1000

@description('Default time to live of episodes in seconds (at most 2^31 - 1, as Cosmos DB allows); -1 or 0 keeps them unless an episode carries its own ttl.')
@minValue(-1)
@maxValue(2147483647)
param episodeTtlSeconds int = -1

@description('Principal id of the managed identity the Function app runs as.')
param functionPrincipalId string

@description('Principal id of the deploying user or pipeline (empty: no role for it).')
param userPrincipalId string = ''

@description('Principal id of the identity agents run as (empty: the agent roles are defined but not assigned).')
param agentPrincipalId string = ''

@description('Assign agentPrincipalId the agent roles (false: agents reach Cosmos DB only through the Function app).')
param agentDirectCosmosAccess bool = true

// Resource Manager checks @allowed without regard to case, so 'serverless' arrives here too.
var serverless = capacityMode =~ 'Serverless'

// Cosmos DB refuses a default time to live of 0; 0 asks for no default lifetime, which is -1.
var episodeDefaultTtl = (episodeTtlSeconds == 0) ? -1 : episodeTtlSeconds

// Every container indexes everything except the ETag (CosmosStore's ContainerSpec.indexing_policy).
var excludedPaths = [
  {
    path: '/"_etag"/?'
  }
]
var includedPaths = [
  {
    path: '/*'
  }
]

// name, partition key, time to live and composite indexes, as agent_learning.store.cosmos expects.
// Only episodes expire (when an episode says so, or after episodeTtlSeconds when it is positive);
// scores, policies, runs and feedback are the learning record and leases belong to the change-feed
// trigger.
// Every key keeps a logical partition (one value of the full key, capped at 20 GB) bounded
// however long an agent runs. Score slots have a hierarchical key (MultiHash, version 2):
// [agent_id, id] holds one document per logical partition, and the trainer's query on an agent's
// new scores is scoped to its first level. The Hash keys keep the definition the containers were
// created with: Cosmos cannot change a container's partition key. Deployments from before the
// hierarchical key also have `scores` (key /id); this template no longer declares it and an
// incremental deployment leaves it in place until its scores are copied (docs/operating.md).
var containers = [
  {
    name: 'episodes'
    partitionKey: {
      paths: [
        '/id'
      ]
      kind: 'Hash'
    }
    defaultTtl: episodeDefaultTtl
    compositeIndexes: []
  }
  {
    name: 'agent-scores'
    partitionKey: {
      paths: [
        '/agent_id'
        '/id'
      ]
      kind: 'MultiHash'
      version: 2
    }
    defaultTtl: null
    compositeIndexes: [
      [
        {
          path: '/agent_id'
          order: 'ascending'
        }
        {
          path: '/seq'
          order: 'ascending'
        }
        {
          path: '/id'
          order: 'ascending'
        }
      ]
    ]
  }
  {
    name: 'policies'
    partitionKey: {
      paths: [
        '/agent_id'
      ]
      kind: 'Hash'
    }
    defaultTtl: null
    compositeIndexes: []
  }
  {
    name: 'runs'
    partitionKey: {
      paths: [
        '/agent_id'
      ]
      kind: 'Hash'
    }
    defaultTtl: null
    compositeIndexes: []
  }
  {
    name: 'feedback'
    partitionKey: {
      paths: [
        '/episode_id'
      ]
      kind: 'Hash'
    }
    defaultTtl: null
    compositeIndexes: []
  }
  {
    name: 'leases'
    partitionKey: {
      paths: [
        '/id'
      ]
      kind: 'Hash'
    }
    defaultTtl: null
    compositeIndexes: []
  }
]

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' = {
  name: accountName
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    // checkov:skip=CKV_AZURE_101: agents outside Azure and Flex Consumption without a virtual network reach Cosmos DB over its public endpoint; local keys are disabled, so every request needs an Entra ID token and a data-plane role
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: 'Session'
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: serverless ? [
      {
        name: 'EnableServerless'
      }
    ] : []
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: 'Enabled'
    enableAutomaticFailover: false
    enableMultipleWriteLocations: false
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-11-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
    options: serverless ? {} : {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    }
  }
}

resource container 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = [for c in containers: {
  parent: database
  name: c.name
  properties: {
    resource: {
      id: c.name
      partitionKey: c.partitionKey
      defaultTtl: c.defaultTtl
      indexingPolicy: {
        indexingMode: 'consistent'
        includedPaths: includedPaths
        excludedPaths: excludedPaths
        compositeIndexes: c.compositeIndexes
      }
    }
  }
}]


// Data-plane access (Cosmos DB SQL role assignments, not Azure RBAC). Scopes are paths under the
// account: /dbs/<database> and /dbs/<database>/colls/<container>. Cosmos DB takes an exclusive lock
// on the account for each role definition and assignment and refuses a second one meanwhile (412,
// "another user operation in progress"), so they are made one at a time, in the order below,
// after the containers: each depends on the one before it (a skipped one counts as done).
var databaseScope = '${account.id}/dbs/${databaseName}'
var policiesScope = '${databaseScope}/colls/policies'
var episodesScope = '${databaseScope}/colls/episodes'
var readMetadata = 'Microsoft.DocumentDB/databaseAccounts/readMetadata'
var readItems = 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/read'
var createItems = 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers/items/create'

// Cosmos DB Built-in Data Contributor. The pipeline reads and writes every container (the
// change-feed trigger also creates, replaces and deletes leases), so the database is its scope.
var builtInDataContributor = '${account.id}/sqlRoleDefinitions/00000000-0000-0000-0000-000000000002'

// What an agent needs, and no more: point-read its current policy, and create (and re-read, to
// recognise a retried write) its episodes. Built-in roles grant every container they are
// assigned on the same rights, so each right is its own custom role assignable on one container.
// Data-plane roles stop at the container: these let an agent write episodes under any agent id
// and read any agent's policy. Deployments that isolate agents from each other set
// agentDirectCosmosAccess to false and send agents through the Function app's routes instead.
resource policyReaderRole 'Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-11-15' = {
  parent: account
  name: guid(account.id, databaseName, 'policy-reader')
  dependsOn: [
    container
  ]
  properties: {
    roleName: 'agent-learning policy reader (${databaseName})'
    type: 'CustomRole'
    assignableScopes: [
      policiesScope
    ]
    permissions: [
      {
        dataActions: [
          readMetadata
          readItems
        ]
      }
    ]
  }
}

resource episodeWriterRole 'Microsoft.DocumentDB/databaseAccounts/sqlRoleDefinitions@2024-11-15' = {
  parent: account
  name: guid(account.id, databaseName, 'episode-writer')
  dependsOn: [
    policyReaderRole
  ]
  properties: {
    roleName: 'agent-learning episode writer (${databaseName})'
    type: 'CustomRole'
    assignableScopes: [
      episodesScope
    ]
    permissions: [
      {
        dataActions: [
          readMetadata
          readItems
          createItems
        ]
      }
    ]
  }
}

resource functionDataContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = {
  parent: account
  name: guid(account.id, databaseScope, functionPrincipalId, 'data-contributor')
  dependsOn: [
    episodeWriterRole
  ]
  properties: {
    roleDefinitionId: builtInDataContributor
    principalId: functionPrincipalId
    scope: databaseScope
  }
}

// The deploying user: `agent-learn init-policy`, and the app or the CLI run locally against this database.
resource userDataContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (!empty(userPrincipalId)) {
  parent: account
  name: guid(account.id, databaseScope, userPrincipalId, 'data-contributor')
  dependsOn: [
    functionDataContributor
  ]
  properties: {
    roleDefinitionId: builtInDataContributor
    principalId: userPrincipalId
    scope: databaseScope
  }
}

resource agentPolicyReader 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (agentDirectCosmosAccess && !empty(agentPrincipalId)) {
  parent: account
  name: guid(account.id, policiesScope, agentPrincipalId, 'policy-reader')
  dependsOn: [
    userDataContributor
  ]
  properties: {
    roleDefinitionId: policyReaderRole.id
    principalId: agentPrincipalId
    scope: policiesScope
  }
}

resource agentEpisodeWriter 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (agentDirectCosmosAccess && !empty(agentPrincipalId)) {
  parent: account
  name: guid(account.id, episodesScope, agentPrincipalId, 'episode-writer')
  dependsOn: [
    agentPolicyReader
  ]
  properties: {
    roleDefinitionId: episodeWriterRole.id
    principalId: agentPrincipalId
    scope: episodesScope
  }
}

output accountName string = account.name
output accountId string = account.id
output endpoint string = account.properties.documentEndpoint
output databaseName string = database.name
output policyReaderRoleName string = policyReaderRole.name
output episodeWriterRoleName string = episodeWriterRole.name
